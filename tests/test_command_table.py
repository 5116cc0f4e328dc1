"""The README's command table matches the commands: every command and every flag the CLI has is in its row,
and every flag a row names is one its command takes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parent.parent
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-z])(?![\w-])")


def table_rows() -> list[list[str]]:
    """The code spans of each row of the table under "## Command line"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row.replace("\\|", "|")) for row in rows]


def options(command: Any) -> set[str]:
    """The option names a (Typer-built Click) command takes."""
    return {opt for p in command.params if p.param_type_name == "option" for opt in p.opts} - {"--help"}


def commands() -> tuple[Any, dict[str, Any]]:
    """The program's group and every command by its name (``memory list`` for the memory's own)."""
    from maxkernel.cli import app
    from memory.cli import app as memory_app

    root = typer.main.get_command(app)
    found = {name: cmd for name, cmd in root.commands.items() if name != "memory"}  # type: ignore[attr-defined]
    memory = typer.main.get_command(memory_app)
    found |= {f"memory {name}": cmd for name, cmd in memory.commands.items()}  # type: ignore[attr-defined]
    return root, found


def spans_by_command(rows: list[list[str]], root: Any, known: dict[str, Any]) -> dict[str, list[str]]:
    """Each command's spans: the ``maxkernel ...`` spans that name it, and the flag spans of its row."""
    out: dict[str, list[str]] = {}
    for spans in rows:
        named: list[str] = []
        for span in spans:
            if not span.startswith("maxkernel"):
                if span.startswith("-") and named:
                    out[named[0]].append(span)
                continue
            words = [w for w in span.split()[1:] if not w.startswith("-") and not w.isupper()]
            head = next((w for w in words if w in root.commands), None)
            if head is None:
                out.setdefault("", []).append(span)  # the program's own options
                continue
            names = [head]
            if head == "memory":
                rest = span.split("memory", 1)[1]
                names = [f"memory {alt.split()[0]}" for alt in rest.split("|") if alt.split()]
                for alt, name in zip(rest.split("|"), names):
                    out.setdefault(name, []).append(alt)
                named += names
                continue
            out.setdefault(head, []).append(span.split(head, 1)[1])
            named.append(head)
    return out


def test_every_command_and_flag_is_in_the_table_and_every_listed_flag_exists() -> None:
    root, known = commands()
    table = spans_by_command(table_rows(), root, known)
    assert set(known) <= set(table), f"commands missing from the README table: {sorted(set(known) - set(table))}"
    unknown_commands = set(table) - set(known) - {""}
    assert not unknown_commands, f"the README table names commands the CLI lacks: {sorted(unknown_commands)}"
    problems: list[str] = []
    for name, spans in table.items():
        takes = options(root) if name == "" else options(known[name])
        listed = {flag for span in spans for flag in FLAG.findall(span)}
        problems += [f"{name or 'maxkernel'}: {flag} is no option" for flag in sorted(listed - takes)]
        missing = {o for o in takes if o.startswith("--")} - listed
        if name == "memory search":
            missing -= {"--k"}  # listed as -k
        problems += [f"{name or 'maxkernel'}: {flag} is not in the table" for flag in sorted(missing)]
    assert not problems, "\n".join(problems)
