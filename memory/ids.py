"""One id rule for every command: a full id or any unique prefix of at least four characters.

Kernels, notes, sessions, searches and jobs all carry hex ids; a user copies a few characters from a
table and expects every command to take them. Ambiguity names the ids that matched, so the user knows
how many characters to add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from memory.errors import RecordNotFoundError

MIN_PREFIX = 4
SHOWN = 5  # ids named in an ambiguity message


def resolve_prefix(conn: Any, kinds: Sequence[tuple[str, Any]], prefix: str, where: str) -> tuple[str, str]:
    """``(kind, full id)`` of the one row whose id starts with ``prefix``.

    ``conn`` is a SQLAlchemy connection or ORM session; ``kinds`` pairs a name ("job", "session", ...)
    with its id column. An exact id wins over longer ids that share it as a prefix.
    """
    prefix = prefix.strip().lower()
    kind_names = [name for name, _ in kinds]
    names = " or ".join(filter(None, [", ".join(kind_names[:-1]), kind_names[-1]]))
    if len(prefix) < MIN_PREFIX:
        # a whole id is always accepted, however short; a prefix needs MIN_PREFIX characters
        for name, column in kinds:
            if conn.execute(sa.select(column).where(column == prefix)).first() is not None:
                return name, prefix
        raise RecordNotFoundError(f"id {prefix!r} is too short: give at least {MIN_PREFIX} characters of a {names} id")
    found: list[tuple[str, str]] = []
    for name, column in kinds:
        query = sa.select(column).where(column.startswith(prefix, autoescape=True)).limit(SHOWN + 1)
        found += [(name, str(i)) for i in conn.execute(query).scalars()]
    exact = [f for f in found if f[1] == prefix]
    if exact:
        return exact[0]
    if not found:
        raise RecordNotFoundError(f"no {names} with id {prefix!r} in {where}")
    if len(found) > 1:
        listed = ", ".join(f"{name} {i}" for name, i in found[:SHOWN])
        more = " and more" if len(found) > SHOWN else ""
        raise RecordNotFoundError(f"id {prefix!r} is ambiguous in {where}: {listed}{more}; give more characters")
    return found[0]
