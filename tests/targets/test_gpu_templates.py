"""Every GPU template on every suite task it matches: correct in interpret mode at ``cpu`` size, and lowering
for gpu-h100 and gpu-a100 at ``full`` size (the lowering half needs the CUDA plugin)."""

from __future__ import annotations

from functools import cache

import pytest

from jaxbench.task import SUITE_DIR, Task, load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies, render
from maxkernel.targets.gpu_lowering import plugin_available, validate_gpu
from maxkernel.templates.gpu import GPU_TEMPLATES

MATCHED = {
    "gpu_rowblock": ["12p_RMSNorm"],
    "gpu_flash_attention": ["1p_Flash_Attention", "2p_GQA_Attention"],
    "gpu_matmul_epilogue": ["19k_Matmul_Subtract_Multiply_ReLU", "20k_Gemm_Multiply_LeakyReLU", "27k_Matmul_Mish_Mish",
                            "30k_Matmul_Scaling_ResidualAdd", "35k_Gemm_Scaling_Hardtanh_GELU",
                            "37k_Matmul_Swish_Scaling", "41k_Gemm_Add_ReLU", "44k_Matmul_Divide_GELU",
                            "47k_Matmul_Add_Swish_Tanh_GELU_Hardtanh", "8p_GEMM"],
    "gpu_paged_decode": ["6p_Paged_Attention"],
    "gpu_grouped_matmul": ["11p_Megablox_GMM", "14p_Ragged_Dot"],
}
# The first task of each template runs in every test run; the others are the sweep (`--sweep`, run by CI).
CASES = [pytest.param(name, task, marks=() if i == 0 else pytest.mark.sweep)
         for name, tasks in MATCHED.items() for i, task in enumerate(tasks)]
# Where the cpu size would take the interpreter thousands of grid steps: 12p's GPU row blocks hold one row
# (32 KiB at full size), so its cpu size runs 4096 of them; 64 rows of the cpu size's width run the same body.
INTERPRET_SIZES = {"12p_RMSNorm": {"batch": 1, "seq": 64, "hidden": 2048}}


@cache
def _source(template: str, task_id: str, size: str = "cpu") -> str:
    """The template's default candidate for gpu-h100, as the rules brain proposes it, rendered for ``size``
    and ``full``."""
    task = _task(task_id, size)
    strategies = propose_strategies(task, analyze_task(task), "gpu-h100")
    (found,) = [s for s in strategies if s.name == f"template:{template}"]
    if size == "cpu":
        return render(task, found)
    (chosen,) = [t for t in GPU_TEMPLATES if t.name == template]
    return chosen.render(task, found.params, (size, "full"))


def _task(task_id: str, size: str) -> Task:
    task = load_task(task_id)
    return task if size == "cpu" else task.with_size(size, INTERPRET_SIZES[task_id])


@pytest.mark.slow
def test_gpu_templates_match_exactly_the_listed_suite_tasks() -> None:
    """One pass over the suite (each task analysed once): what each GPU template applies to is listed above,
    so the tests below cover every task it matches."""
    matched: dict[str, list[str]] = {t.name: [] for t in GPU_TEMPLATES}
    for path in sorted(p for p in SUITE_DIR.iterdir() if (p / "task.yaml").exists()):
        task = load_task(path.name)
        analysis = analyze_task(task)
        for template in GPU_TEMPLATES:
            if template.applies(task, analysis) is None:
                matched[template.name].append(task.id)
    assert {name: sorted(ids) for name, ids in matched.items()} == {name: sorted(ids) for name, ids in MATCHED.items()}


@pytest.mark.parametrize(("template", "task_id"), CASES)
@pytest.mark.slow
def test_gpu_template_is_correct_in_interpret_mode(template: str, task_id: str, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    size = "interpret" if task_id in INTERPRET_SIZES else "cpu"
    source = _source(template, task_id, size)
    assert "CompilerParams(" in source and "interpret=" not in source
    report = declared_size_evaluator.evaluate(_task(task_id, size), source, size=size)
    assert report.status == "ok" and report.correct, report.reason
    assert report.label == "pallas-kernel"


@pytest.mark.skipif(not plugin_available(), reason='needs the CUDA plugin: pip install -e ".[gpu]"')
@pytest.mark.parametrize(("template", "task_id"), CASES)
def test_gpu_template_lowers_for_hopper_and_ampere(template: str, task_id: str) -> None:
    source, task = _source(template, task_id), load_task(task_id)
    for chip in ("h100", "a100"):
        lowered = validate_gpu(source, task, chip)
        assert lowered.ok, lowered.reason
        # A row block that multiplies nothing holds its loads in registers: no shared memory at all.
        assert lowered.backends == ["triton"] and lowered.smem_bytes is not None
        assert lowered.smem_bytes <= lowered.smem_budget_bytes
