"""Finding the kernel in a model's reply."""

from __future__ import annotations

from actors.brains.codeblocks import extract_kernel


def test_last_block_defining_kernel_wins() -> None:
    reply = "first\n```python\ndef kernel(x):\n    return x\n```\nbetter:\n```py\nimport jax\n\ndef kernel(x):\n    return x + 0\n```\n```python\nprint('usage')\n```"
    source, reason = extract_kernel(reply)
    assert source == "import jax\n\ndef kernel(x):\n    return x + 0\n" and reason == ""


def test_reasons_name_what_is_missing() -> None:
    assert extract_kernel("no code at all")[1].startswith("the reply has no fenced ```python code block")
    source, reason = extract_kernel("```python\ndef helper():\n    pass\n```")
    assert source is None and "def kernel(" in reason


def test_syntax_errors_go_to_the_judge() -> None:
    source, _ = extract_kernel("```python\ndef kernel(x)\n    return x\n```")
    assert source is not None and source.startswith("def kernel(x)")
