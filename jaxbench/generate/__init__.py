"""Tasks drawn fresh from a grammar of the building blocks of current models (see ``docs/generality.md``).

``draw(seed, count)`` gives the drafts of one seed under the committed mix (``mix.yaml``); ``write_task``
writes one as a task folder with its tolerance measured from the reference's own error.
"""

from jaxbench.generate.draw import Mix, Slot, draw, load_mix, plan, task_id
from jaxbench.generate.write import write_task

__all__ = ["Mix", "Slot", "draw", "load_mix", "plan", "task_id", "write_task"]
