"""The numbers a profiler reasons from, gathered from one evaluation report.

Sources: the judge's timings, XLA's cost analysis of reference and candidate (FLOPs, bytes), and for TPU
targets the roofline cost model (per-kernel compute, memory and grid-overhead times). Both profiler
brains start from these facts; the rules brain turns them into a diagnosis by thresholds, the LLM brain
reads them in its prompt.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from actors.policy import describe
from jaxbench.report import EvalReport as JudgeReport

# Ridge point (FLOPs per byte) of a CPU core running XLA code: a few tens of GFLOP/s against ~10 GB/s.
CPU_RIDGE = 4.0


class ProfileFacts(BaseModel):
    basis: str | None = None
    ref_ms: float | None = None
    kernel_ms: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    cv: float | None = None
    ref_flops: float | None = None
    ref_bytes: float | None = None
    intensity: float | None = None
    ridge: float | None = None
    achieved_gflops: float | None = None
    achieved_gbps: float | None = None
    bound: str = "unknown"
    model_bound: str | None = None
    compute_ms: float | None = None
    memory_ms: float | None = None
    overhead_ms: float | None = None
    grid_steps: int | None = None
    vmem_bytes: int | None = None
    vmem_budget_bytes: int | None = None
    hot_kernels: list[dict[str, Any]] = []
    label: str | None = None

    def lines(self) -> list[str]:
        """The facts as short 'name: value' lines (for prompts and notes)."""
        return [f"{k}: {v}" for k, v in self.model_dump(exclude_none=True).items() if v not in ([], "unknown")]


def gather(report: JudgeReport) -> ProfileFacts:
    facts = ProfileFacts(basis=report.basis, ref_ms=report.ref_ms, kernel_ms=report.kernel_ms, speedup=report.speedup,
                         speedup_ci=report.interval, cv=report.cv, ref_flops=report.ref_flops, ref_bytes=report.ref_bytes, label=report.label)
    # The reference's cost analysis is reliable (no loops hidden in a pallas_call); it gives the work.
    if report.ref_flops and report.ref_bytes:
        facts.intensity = round(report.ref_flops / report.ref_bytes, 3)
    if report.kernel_ms and report.ref_flops:
        facts.achieved_gflops = round(report.ref_flops / (report.kernel_ms * 1e6), 3)
    if report.kernel_ms and report.ref_bytes:
        facts.achieved_gbps = round(report.ref_bytes / (report.kernel_ms * 1e6), 3)
    model = (report.model or {}).get("candidate")
    if model:
        facts.model_bound = model.get("bound")
        facts.bound = str(model.get("bound") or "unknown")
        for name in ("compute_ms", "memory_ms", "overhead_ms", "grid_steps", "vmem_bytes", "vmem_budget_bytes"):
            setattr(facts, name, model.get(name))
        kernels = sorted(model.get("kernels") or [], key=lambda k: -float(k.get("time_ms", 0.0)))
        facts.hot_kernels = [{k: kern.get(k) for k in ("name", "grid", "time_ms", "bound", "vmem_bytes")}
                             for kern in kernels[:3]]
    elif facts.intensity is not None:
        facts.ridge = CPU_RIDGE
        facts.bound = "compute" if facts.intensity >= CPU_RIDGE else "memory"
    return facts


def rules_diagnosis(facts: ProfileFacts, target: str) -> tuple[str, list[str]]:
    """A short diagnosis and what to try, by thresholds on the facts."""
    parts: list[str] = []
    tries: list[str] = []
    if facts.speedup is not None:
        parts.append(f"{facts.basis or 'measured'} {facts.kernel_ms} ms vs reference {facts.ref_ms} ms "
                     f"({describe(facts.speedup, facts.speedup_ci)})")
    if facts.intensity is not None:
        parts.append(f"arithmetic intensity {facts.intensity} FLOP/byte -> {facts.bound}-bound")
    if facts.achieved_gflops is not None:
        parts.append(f"achieves {facts.achieved_gflops} GFLOP/s, {facts.achieved_gbps} GB/s of useful traffic")
    if facts.overhead_ms is not None and facts.compute_ms is not None and facts.memory_ms is not None:
        parts.append(f"model: compute {facts.compute_ms:.4g} ms, memory {facts.memory_ms:.4g} ms, "
                     f"grid overhead {facts.overhead_ms:.4g} ms over {facts.grid_steps} steps")
        if facts.overhead_ms > 0.2 * max(facts.compute_ms, facts.memory_ms):
            tries.append("grid-step overhead is large: use bigger blocks (fewer grid steps)")
    if facts.vmem_bytes and facts.vmem_budget_bytes and facts.vmem_bytes > 0.8 * facts.vmem_budget_bytes:
        tries.append("VMEM use is near the budget: shrink the K block or single-buffer the resident operand")
    if target == "cpu":
        tries.append("interpreted Pallas pays per grid step on CPU: prefer the largest blocks that divide the shape")
    if facts.bound == "memory":
        tries.append("fuse the epilogue and avoid extra HBM round trips; keep blocks lane-dense (last dim % 128 == 0)")
    elif facts.bound == "compute":
        tries.append("keep the MXU fed: K innermost and 'arbitrary', f32 accumulator in VMEM scratch, 128/256-multiple tiles")
    if facts.hot_kernels:
        hot = facts.hot_kernels[0]
        parts.append(f"hot spot: {hot.get('name')} grid {hot.get('grid')} ({hot.get('time_ms')} ms, {hot.get('bound')}-bound)")
    return "; ".join(parts) or "no timing or cost figures in the report", tries
