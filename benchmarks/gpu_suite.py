"""The suite on a GPU target, all modelled on this machine: per task the reference, our GPU template's
kernel and JAX's own GPU Pallas kernel (``jax.experimental.pallas.ops.gpu``) where one covers the task, each
lowered for the chip and priced by the same GPU cost model (a benchmark, not a test; needs ``.[gpu]``).

    python benchmarks/gpu_suite.py [--chip h100] [--json FILE]

Correctness is not re-checked here (the evaluator does that, in interpret mode, when it evaluates a kernel);
what this table compares is lowering and the model's figures, ours against theirs on one model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

# JAX's expert kernels as candidate files for a task: its layout turned into theirs and back.
EXPERT_SOURCES: dict[str, str] = {
    "1p_Flash_Attention": '''\
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu.attention import mha


def kernel(q, k, v):
    to_bshd = lambda t: jnp.swapaxes(t, 1, 2)
    out = mha(to_bshd(q), to_bshd(k), to_bshd(v), None, sm_scale=q.shape[-1] ** -0.5, causal=True)
    return jnp.swapaxes(out, 1, 2)
''',
    "2p_GQA_Attention": '''\
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu.attention import mha


def kernel(q, k, v):
    # mha takes as many kv heads as query heads: each kv head repeated for its group.
    group = q.shape[1] // k.shape[1]
    to_bshd = lambda t: jnp.swapaxes(t, 1, 2)
    k, v = (jnp.repeat(t, group, axis=1) for t in (k, v))
    out = mha(to_bshd(q), to_bshd(k), to_bshd(v), None, sm_scale=q.shape[-1] ** -0.5, causal=True)
    return jnp.swapaxes(out, 1, 2)
''',
    "6p_Paged_Attention": '''\
from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention


def kernel(q, k_pages, v_pages, page_table, lengths):
    # k_splits must divide pages_per_seq (64 at cpu size, 256 at full); its default, 16, does.
    return paged_attention(q, k_pages, v_pages, page_table, lengths)
''',
    "12p_RMSNorm": '''\
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu.rms_norm import rms_norm


def kernel(x, weight, *, eps):
    return rms_norm(x, weight, jnp.zeros_like(weight), eps=eps)
''',
}


def ours_source(task: Any, chip: str) -> tuple[str, str] | None:
    """(strategy, source) of the first GPU template the rules propose for the task, or None."""
    from maxkernel.analysis import analyze_task
    from maxkernel.rules.strategy import propose_strategies, render

    for strategy in propose_strategies(task, analyze_task(task), f"gpu-{chip}"):
        if strategy.kind == "template":
            return strategy.name, render(task, strategy)
    return None


def priced(source: str, task: Any, chip: str) -> dict[str, Any]:
    """Lowered and modelled figures of one source, or why it has none."""
    from maxkernel.targets.gpu_lowering import validate_gpu
    from maxkernel.targets.gpu_model import model_gpu_candidate
    from maxkernel.targets.names import TargetError

    lowered = validate_gpu(source, task, chip)
    if not lowered.ok:
        return {"ms": None, "why": lowered.reason}
    try:
        return {"ms": model_gpu_candidate(source, task, chip).time_ms, "why": ""}
    except TargetError as exc:
        return {"ms": None, "why": str(exc)}


def run(tasks: list[str], chip: str, note: Callable[[str], None]) -> list[dict[str, Any]]:
    from jaxbench.task import load_task
    from maxkernel.targets.gpu_model import model_gpu_reference

    rows = []
    for name in tasks:
        task = load_task(name)
        note(f"{name}: modelling on gpu-{chip}")
        row: dict[str, Any] = {"task": name, "reference_ms": model_gpu_reference(task, chip).time_ms}
        found = ours_source(task, chip)
        row["ours"] = {"strategy": found[0], **priced(found[1], task, chip)} if found else None
        row["theirs"] = priced(EXPERT_SOURCES[name], task, chip) if name in EXPERT_SOURCES else None
        rows.append(row)
    return rows


def _ms(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['ms']:.4f}" if entry["ms"] is not None else f"failed: {entry['why'][:60]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", default="h100")
    parser.add_argument("--tasks", nargs="*", default=sorted(EXPERT_SOURCES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    rows = run(args.tasks, args.chip, lambda m: console.print(f"[dim]{m}[/dim]"))
    table = Table(title=f"gpu-{args.chip}, modelled (ms)")
    for column in ("task", "reference", "ours", "JAX's GPU kernel", "ours vs theirs"):
        table.add_column(column)
    for row in rows:
        ours, theirs = row["ours"], row["theirs"]
        ratio = (f"{theirs['ms'] / ours['ms']:.2f}x" if ours and theirs and ours["ms"] and theirs["ms"] else "-")
        table.add_row(row["task"], f"{row['reference_ms']:.4f}", _ms(ours), _ms(theirs), ratio)
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
