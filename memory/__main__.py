"""``python -m memory``: the memory CLI on its own (the main CLI mounts it as ``maxkernel memory``)."""

from memory.cli import app

app(prog_name="memory")
