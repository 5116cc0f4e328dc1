"""Prompt files (actors/prompts/*.md) filled in with the task, recalled knowledge and feedback.

``string.Template`` ($name) rather than ``str.format``, so that braces in code and math need no escaping.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

import jax
import structlog

from jaxbench.task import Task
from maxkernel.messages import Recall

if TYPE_CHECKING:
    from memory import Memory

log = structlog.get_logger("actors.prompting")

PROMPTS = Path(__file__).resolve().parent / "prompts"


@lru_cache(maxsize=None)
def _file(name: str) -> str:
    return (PROMPTS / f"{name}.md").read_text(encoding="utf-8")


def render(name: str, **values: Any) -> str:
    values.setdefault("guide", _file("pallas_guide"))
    return Template(_file(name)).safe_substitute({k: str(v) for k, v in values.items()})


def system_prompt(role: str, **values: Any) -> str:
    return render(role, **values)


@lru_cache(maxsize=64)
def _shapes(task: Task, size: str) -> str:
    args = jax.eval_shape(lambda key: task.get_inputs(key, size)[0], jax.random.key(0))
    return ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in args)


def task_block(task: Task, target: str, size: str) -> str:
    tol = task.spec.tolerance
    return render("task", task_id=task.id, category=task.spec.category, target=target,
                  description=task.spec.description.strip(), atol=tol.atol, rtol=tol.rtol, dtype=task.spec.dtype,
                  shapes=_shapes(task, size), reference=task.reference_path.read_text(encoding="utf-8").strip())


def recall_block(recall: Recall | None, limit_chars: int = 6000) -> str:
    if recall is None or not (recall.kernels or recall.notes):
        return "## Memory\nNothing recalled."
    out = ["## Memory"]
    used = 0
    for k in recall.kernels:
        if used + len(k.code) > limit_chars:
            break
        used += len(k.code)
        out.append(f"Verified kernel for {k.task_id} (similarity {k.score:.2f}, {k.speedup}x, {k.strategy}):\n"
                   f"```python\n{k.code.strip()}\n```")
    out += [f"Note ({n.outcome}): {n.text}" for n in recall.notes]
    return "\n\n".join(out)


def outcomes_block(memory: "Memory", task: Task, target: str) -> str:
    """How strategies fared on the nearest measured tasks (the rules brain's strategy priors, in words)."""
    from actors.priors import NEIGHBOURS, strategy_priors

    try:
        priors = strategy_priors(memory.strategy_outcomes(task, target, NEIGHBOURS))
    except Exception as exc:  # memory is advice: the prompt goes out without it
        log.warning("prompting.outcomes_unavailable", task=task.id, error=f"{type(exc).__name__}: {exc}")
        return ""
    if not priors:
        return ""
    lines = [f"- {p.name}: {'; '.join(p.reasons)}" for p in sorted(priors.values(), key=lambda p: -p.score)]
    return "## How strategies fared on similar tasks (on " + target + ")\n" + "\n".join(lines)


# -- JAX's own Pallas kernels as examples of the idiom ----------------------------------------------

# (what the analysis shows, kernel for TPU-style targets, kernel for GPU targets), first match wins;
# paths are relative to jax/experimental/pallas/ops of the installed JAX.
EXPERTS: tuple[tuple[str, str, str], ...] = (
    ("ragged_dot_general", "tpu/megablox/gmm.py", "gpu/ragged_dot_mgpu.py"),
    ("paged_attention", "tpu/paged_attention/paged_attention_kernel.py", "gpu/paged_attention.py"),
    ("attention", "tpu/flash_attention.py", "gpu/attention.py"),
    ("rmsnorm", "gpu/rms_norm.py", "gpu/rms_norm.py"),
    ("layernorm", "gpu/layer_norm.py", "gpu/layer_norm.py"),
    ("softmax", "gpu/softmax.py", "gpu/softmax.py"),
    ("matmul", "tpu/matmul.py", "gpu/hopper_matmul_mgpu.py"),
    ("conv", "tpu/matmul.py", "gpu/hopper_matmul_mgpu.py"),
)
OPS = Path(jax.__file__).resolve().parent / "experimental" / "pallas" / "ops"


def expert_for(patterns: list[str], primitives: list[str], target: str) -> str | None:
    """The expert kernel (path under ``OPS``) closest to what the reference does, or None."""
    seen = set(patterns) | set(primitives)
    if "attention" in seen and "gather" in seen:
        seen.add("paged_attention")
    for key, tpu, gpu in EXPERTS:
        if key in seen:
            path = gpu if target.startswith("gpu") else tpu
            return path if (OPS / path).exists() else None
    return None


def kernel_excerpt(source: str, limit_chars: int) -> str:
    """The imports and the definitions that build the kernel (a ``pallas_call``, or ``kernel`` in the
    name), in file order, up to ``limit_chars``; the whole file, without its license, when it fits."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), 0)
    body = "\n".join(lines[start:])
    if len(body) <= limit_chars:
        return body
    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and ("kernel" in n.name or "pallas_call" in (ast.get_source_segment(source, n) or ""))]
    parts = ["\n".join(ast.get_source_segment(source, n) or "" for n in keep)]
    used = len(parts[0])
    for node in defs:
        text = ast.get_source_segment(source, node) or ""
        if used + len(text) > limit_chars:
            cut = text[: max(0, limit_chars - used)].rsplit("\n", 1)[0]
            parts.append(f"{cut}\n# ... (the rest of {node.name} and later definitions left out)")
            break
        parts.append(text)
        used += len(text)
    return "\n\n".join(parts)


@lru_cache(maxsize=64)
def _analysis_keys(task: Task, target: str, size: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from maxkernel.analysis import analyze_task

    analysis = analyze_task(task, target, size)
    return tuple(analysis.patterns), tuple(analysis.primitives)


def expert_block(task: Task, target: str, size: str, limit_chars: int = 8000) -> str:
    """The closest kernel of the installed JAX, read from its source now, as an example of the idiom."""
    try:
        patterns, primitives = _analysis_keys(task, target, size)
    except Exception as exc:  # a reference that cannot be analysed still gets its prompt
        log.warning("prompting.analysis_failed", task=task.id, error=f"{type(exc).__name__}: {exc}")
        return ""
    path = expert_for(list(patterns), list(primitives), target)
    if path is None:
        return ""
    source = (OPS / path).read_text(encoding="utf-8")
    return (f"## Example of the idiom: jax/experimental/pallas/ops/{path} (JAX {jax.__version__})\n"
            "One of JAX's own Pallas kernels for this kind of computation; learn from its grid, BlockSpecs and "
            "accumulators, write your own kernel for this task.\n"
            f"```python\n{kernel_excerpt(source, limit_chars).strip()}\n```")
