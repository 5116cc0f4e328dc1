"""Remembering and recalling kernels and notes through ``Memory``, on one machine (SQLite file +
embedded Chroma) and on shared servers (PostgreSQL + a Chroma server)."""

from __future__ import annotations

import pytest

from jaxbench import load_task
from jaxbench.report import EvalReport
from maxkernel.config import Settings
from memory import Memory
from memory.errors import MemoryStoreError, UnverifiedKernelError, VectorStoreError
from memory.vectors import KERNELS, NOTES

EPILOGUES = ("t_gemm_relu", "t_gemm_tanh_scale")
OTHERS = ("t_rmsnorm", "t_softmax", "t_cumsum")


@pytest.fixture
def memory(settings: Settings):
    with Memory.open(settings) as m:
        yield m


def _remember_all(memory: Memory, task_dir, make_report, make_code) -> dict[str, str]:
    ids = {}
    for i, name in enumerate(EPILOGUES + OTHERS):
        record = memory.remember_kernel(
            make_report(name, speedup=1.0 + i), make_code(name), task=load_task(task_dir(name)), strategy=f"s{i}"
        )
        ids[name] = record.id
    return ids


@pytest.mark.parametrize(
    "report",
    [
        EvalReport(task="t_gemm_relu", status="incorrect", correct=False, speedup=3.0),
        EvalReport(task="t_gemm_relu", status="ok", correct=False, speedup=3.0),
        EvalReport(task="t_gemm_relu", status="compile_error", correct=True),
        EvalReport(task="t_gemm_relu", status="timeout"),
    ],
    ids=["incorrect", "ok-but-wrong", "compile-error", "timeout"],
)
@pytest.mark.slow
def test_only_passed_kernels_can_be_remembered(memory: Memory, task_dir, make_code, report: EvalReport) -> None:
    with pytest.raises(UnverifiedKernelError, match="only kernels that evaluated ok and correct"):
        memory.remember_kernel(report, make_code("x"), task=load_task(task_dir("t_gemm_relu")))
    assert memory.store.stats().kernels == 0 and memory.store.stats().candidates == 0
    assert memory.vectors.count(KERNELS) == 0


def test_a_matmul_gelu_task_recalls_matmul_epilogues_first(memory: Memory, task_dir, make_report, make_code) -> None:
    ids = _remember_all(memory, task_dir, make_report, make_code)
    hits = memory.recall_kernels(load_task(task_dir("t_gemm_gelu")), k=5)
    assert len(hits) == 5
    assert {h.kernel.task_id for h in hits[:2]} == set(EPILOGUES)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)
    assert scores[1] > scores[2] + 0.1
    relu = next(h.kernel for h in hits if h.kernel.task_id == "t_gemm_relu")
    assert relu.id == ids["t_gemm_relu"]
    assert relu.code == make_code("t_gemm_relu")
    assert (relu.speedup, relu.kernel_ms, relu.ref_ms, relu.basis) == (1.0, 3.4, 3.4, "measured")
    assert relu.report == make_report("t_gemm_relu", speedup=1.0)
    assert relu.strategy == "s0" and relu.category == "matmul" and relu.pattern.startswith("dot_general>add")


def test_recall_of_a_stored_task_scores_its_own_kernel_highest(memory: Memory, task_dir, make_report, make_code) -> None:
    ids = _remember_all(memory, task_dir, make_report, make_code)
    for name in ("t_rmsnorm", "t_softmax"):
        [best] = memory.recall_kernels(name, k=1)  # by id alone: the signature comes from the store
        assert best.kernel.id == ids[name] and best.score > 0.8


def test_recall_filters_by_target(memory: Memory, task_dir, make_report, make_code) -> None:
    task = load_task(task_dir("t_gemm_relu"))
    on_cpu = memory.remember_kernel(make_report("t_gemm_relu"), make_code("a"), task=task)
    on_tpu = memory.remember_kernel(make_report("t_gemm_relu", target="tpu-v5e"), make_code("b"), task=task)
    for i in range(6):  # more cpu kernels than the first unfiltered search returns
        memory.remember_kernel(make_report("t_gemm_relu"), make_code(f"cpu{i}"), task=task)
    assert [h.kernel.id for h in memory.recall_kernels(task, k=3, target="tpu-v5e")] == [on_tpu.id]
    cpu_hits = memory.recall_kernels(task, k=10, target="cpu")
    assert len(cpu_hits) == 7 and on_cpu.id in {h.kernel.id for h in cpu_hits}
    assert memory.recall_kernels(task, k=3, target="gpu") == []
    # a target whose only kernel is far from the query: the 4k nearest are all cpu kernels, so
    # recall must fall back to a filtered search rather than return nothing
    far = memory.remember_kernel(
        make_report("t_cumsum", target="gpu"), make_code("far"), task=load_task(task_dir("t_cumsum"))
    )
    assert [h.kernel.id for h in memory.recall_kernels(task, k=1, target="gpu")] == [far.id]


def test_the_same_kernel_is_remembered_once(memory: Memory, task_dir, make_report, make_code) -> None:
    task = load_task(task_dir("t_gemm_relu"))
    first = memory.remember_kernel(make_report("t_gemm_relu"), make_code("a"), task=task)
    again = memory.remember_kernel(make_report("t_gemm_relu", speedup=9.0), make_code("a"), task=task)
    assert again.id == first.id
    assert memory.store.stats().kernels == 1 and memory.vectors.count(KERNELS) == 1


def test_notes_are_recalled_by_task_structure(memory: Memory, task_dir) -> None:
    relu = memory.remember_note(
        "fusing the bias and activation into the matmul epilogue saved a pass over HBM",
        task=load_task(task_dir("t_gemm_relu")),
        outcome="worked",
        target="tpu-v5e",
    )
    memory.remember_note("a two-pass norm was slower than one pass", task=load_task(task_dir("t_rmsnorm")), outcome="failed")
    memory.remember_note("cumsum wants the scan axis innermost", task=load_task(task_dir("t_cumsum")))
    hits = memory.recall_notes(load_task(task_dir("t_gemm_gelu")), k=3)
    assert hits[0].note.id == relu.id and hits[0].score > hits[1].score
    assert (hits[0].note.outcome, hits[0].note.target, hits[0].note.task_id) == ("worked", "tpu-v5e", "t_gemm_relu")
    assert hits[0].note.pattern.startswith("dot_general>add")
    assert [h.note.id for h in memory.recall_notes(load_task(task_dir("t_gemm_gelu")), k=3, target="tpu-v5e")] == [
        relu.id
    ]
    with pytest.raises(MemoryStoreError, match="empty note"):
        memory.remember_note("   ")


def test_the_same_note_is_stored_once(memory: Memory, task_dir) -> None:
    task = load_task(task_dir("t_gemm_relu"))
    first = memory.remember_note("rowblock worked at 1.4x", task=task, outcome="worked", target="cpu")
    again = memory.remember_note("rowblock worked at 1.4x", task=task, outcome="worked", target="cpu")  # a resume
    assert again.id == first.id and len(memory.store.list_notes()) == 1 and memory.vectors.count(NOTES) == 1
    other = memory.remember_note("rowblock worked at 1.4x", task=task, outcome="worked", target="tpu-v5e")
    assert other.id != first.id and len(memory.store.list_notes()) == 2


def test_free_text_search_finds_matmul_epilogues(memory: Memory, task_dir, make_report, make_code) -> None:
    _remember_all(memory, task_dir, make_report, make_code)
    memory.remember_note("GELU epilogue: compute erf in f32", pattern="matmul+gelu", outcome="worked")
    hits = memory.search("matmul gelu epilogue", k=4)
    kernels = [h.kernel.task_id for h in hits if h.kind == "kernel"]
    assert kernels[0] in EPILOGUES
    assert any(h.kind == "note" for h in hits)
    assert memory.search("t_rmsnorm", k=1, kind="kernels")[0].kernel.task_id == "t_rmsnorm"


def test_memories_survive_reopening(settings: Settings, task_dir, make_report, make_code) -> None:
    with Memory.open(settings) as memory:
        ids = _remember_all(memory, task_dir, make_report, make_code)
        memory.remember_note("keep", task=load_task(task_dir("t_softmax")))
    with Memory.open(settings) as memory:
        stats = memory.stats()
        assert (stats.store.kernels, stats.kernel_vectors, stats.store.notes, stats.note_vectors) == (5, 5, 1, 1)
        [best] = memory.recall_kernels("t_cumsum", k=1)
        assert best.kernel.id == ids["t_cumsum"]


def test_a_chroma_failure_rolls_back_the_sql_write(memory: Memory, task_dir, make_report, make_code, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise VectorStoreError("Chroma failed while storing: test")

    monkeypatch.setattr(memory.vectors, "upsert", broken)
    with pytest.raises(VectorStoreError):
        memory.remember_kernel(make_report("t_gemm_relu"), make_code("a"), task=load_task(task_dir("t_gemm_relu")))
    with pytest.raises(VectorStoreError):
        memory.remember_note("lost?", outcome="failed")
    stats = memory.store.stats()
    assert (stats.kernels, stats.candidates, stats.evaluations, stats.notes) == (0, 0, 0, 0)


def test_reindex_rebuilds_vectors_from_sql(memory: Memory, task_dir, make_report, make_code) -> None:
    ids = _remember_all(memory, task_dir, make_report, make_code)
    memory.remember_note("n", task=load_task(task_dir("t_softmax")))
    memory.vectors.rebuild()  # as if the Chroma directory had been lost
    assert memory.vectors.count(KERNELS) == 0 and memory.recall_kernels("t_softmax", k=1) == []
    assert memory.reindex() == (5, 1)
    assert memory.vectors.count(NOTES) == 1
    assert memory.recall_kernels("t_softmax", k=1)[0].kernel.id == ids["t_softmax"]


def test_changing_the_embedding_needs_a_reindex(local_settings: Settings, task_dir, make_report, make_code) -> None:
    with Memory.open(local_settings) as memory:
        ids = _remember_all(memory, task_dir, make_report, make_code)
    smaller = local_settings.model_copy(update={"embedding": "structural:64"})
    with pytest.raises(VectorStoreError, match="run `maxkernel memory reindex`"):
        Memory.open(smaller)
    with Memory.open(smaller, for_reindex=True) as memory:
        assert memory.reindex() == (5, 0)
    with Memory.open(smaller) as memory:
        assert memory.stats().embedding == "structural-v1-64"
        assert memory.recall_kernels("t_rmsnorm", k=1)[0].kernel.id == ids["t_rmsnorm"]


def test_bulk_remember_is_all_or_nothing_and_pages_cleanly(memory: Memory, task_dir, make_report, make_code) -> None:
    from memory import NewKernel

    task = load_task(task_dir("t_gemm_relu"))
    entries = [NewKernel(task_id="t_gemm_relu", code=make_code(f"k{i}"), report=make_report("t_gemm_relu")) for i in range(7)]
    bad = entries[:3] + [NewKernel(task_id="t_gemm_relu", code="x", report=EvalReport(task="t_gemm_relu", status="timeout"))]
    with pytest.raises(UnverifiedKernelError):
        memory.remember_kernels(bad, tasks=[task] * len(bad))
    assert memory.store.stats().kernels == 0

    records = memory.remember_kernels(entries, tasks=[task] * 7)
    assert [r.id for r in records] == [e.id for e in entries]
    assert len({r.created_at for r in records}) == 1  # one batch, one timestamp: pages must still split cleanly
    pages = list(memory.store.iter_kernels(batch=3))
    assert [len(p) for p in pages] == [3, 3, 1]
    assert sorted(k.id for page in pages for k in page) == sorted(e.id for e in entries)
