"""Typer command functions registered by ``maxkernel.cli`` (kept out of it so each stays small)."""
