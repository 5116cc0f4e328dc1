"""Extraction: a layer's reference split into region tasks that each deserve a kernel, and put back together.

``extract_task(task, out)`` writes the region task folders and times them; ``rejoin`` proves the regions
reproduce the layer; ``extract_function(fn, *args)`` does the same for a function in a user's code.
"""

from maxkernel.extract.layer import Extraction, ExtractError, RegionInfo, extract_task

__all__ = ["ExtractError", "Extraction", "RegionInfo", "extract_task"]
