"""Finding the kernel in a model's reply, and saying why when there is none."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def code_blocks(text: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text or "") if lang.lower() in ("", "python", "py")]


def extract_kernel(text: str) -> tuple[str | None, str]:
    """The last fenced Python block that defines ``kernel``; else None and the reason to send back.

    A block that does not parse is still returned: the evaluator reports it as a compile error with the
    line, which is the feedback the debugger works from.
    """
    blocks = code_blocks(text)
    if not blocks:
        return None, "the reply has no fenced ```python code block; reply with the complete kernel file in one"
    for body in reversed(blocks):
        if re.search(r"^def kernel\s*\(", body, re.MULTILINE):
            return body.strip() + "\n", ""
    return None, "no code block defines a top-level `def kernel(...)` with the reference's signature"
