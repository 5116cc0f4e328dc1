"""Extraction: a layer's reference split into region tasks that each deserve a kernel, and put back together.

``extract_task(task, out)`` writes the region task folders and times them; ``rejoin`` proves the regions
reproduce the layer. The package itself is callable, ``maxkernel.extract(fn, *example_args)``, for a
function in a user's code (see ``function.py``).
"""

import sys
import types
from typing import Any

from maxkernel.extract.layer import Extraction, ExtractError, RegionInfo, extract_task

__all__ = ["ExtractError", "Extraction", "RegionInfo", "extract_task"]


class _CallablePackage(types.ModuleType):
    def __call__(self, fn: Any, *example_args: Any, **options: Any) -> Extraction:
        from maxkernel.extract.function import extract_function

        return extract_function(fn, *example_args, **options)


sys.modules[__name__].__class__ = _CallablePackage
