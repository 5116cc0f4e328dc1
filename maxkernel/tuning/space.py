"""Search space: the legal configurations of a template's tunable parameters (target constraints applied)."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from pydantic import BaseModel

Config = dict[str, Any]


class SearchSpace(BaseModel):
    params: dict[str, list[Any]]
    defaults: Config = {}

    def configs(self, constraint: Callable[[Config], bool] | None = None) -> list[Config]:
        """Every combination of legal values that passes ``constraint`` (defaults first)."""
        if not self.params:
            return [dict(self.defaults)]
        keys = sorted(self.params)
        found = [dict(zip(keys, values)) for values in itertools.product(*(self.params[k] for k in keys))]
        found = [c for c in found if constraint is None or constraint(c)]
        default = {k: self.defaults.get(k, self.params[k][0]) for k in keys}
        if default in found:
            found.remove(default)
            found.insert(0, default)
        return found
