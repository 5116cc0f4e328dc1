"""``Memory``: the SQL store and the vector memory opened together from settings.

Vectors live in Chroma, full records in SQL, under the same ids. A write goes to SQL inside a
transaction, then to Chroma, then the transaction commits: if Chroma fails the SQL rows roll back,
so a kernel is never half-remembered. Each vector names its writer (``host:pid``). A vector whose record never
committed (its writer died between the two, or Chroma stored it and failed before answering) is an orphan:
recall skips it; the writer itself forgets the second kind once Chroma answers again, a daemon that sees
another die forgets the first (``forget_unrecorded``), and ``reindex`` removes any.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import structlog

from jaxbench.report import EvalReport
from jaxbench.task import Task, TaskError, load_task
from maxkernel.analysis.signature import SignatureError, TaskSignature, task_signature
from maxkernel.config import Settings, load_settings
from memory.embedding import Embedder, alias_features, make_embedder
from memory.errors import MemoryStoreError, RecordNotFoundError, UnverifiedKernelError, VectorStoreError
from memory.insights import (
    JUDGED,
    PLANNED,
    TUNED,
    Measurement,
    StrategyOutcome,
    TaskMatch,
    measurements_from_events,
    op_family,
    rank_tasks,
    strategy_outcomes,
)
from memory.models import (
    KernelHit,
    KernelRecord,
    MemoryStats,
    NewKernel,
    NoteHit,
    NoteRecord,
    Outcome,
)
from memory.store import Store, StoreTx
from memory.vectors import COLLECTIONS, KERNELS, NOTES, WRITER, VectorHit, VectorMemory, writer_name

log = structlog.get_logger(__name__)

TaskLike = Task | TaskSignature | str | Path
Kind = Literal["all", "kernels", "notes"]


def kernel_text(strategy: str, code: str) -> str:
    """The text embedded with a kernel: its strategy words and its code."""
    return f"{strategy}\n{code}" if strategy else code


def kernel_metadata(
    task_id: str, report: EvalReport, strategy: str, signature: TaskSignature | None
) -> dict[str, object]:
    """What Chroma keeps beside a kernel's vector: enough to filter and to show a hit."""
    return {
        "task": task_id,
        "target": report.target,
        "speedup": report.speedup,
        "strategy": strategy,
        "category": signature.category if signature else None,
    }


def note_metadata(note: NoteRecord) -> dict[str, object]:
    return {
        "task": note.task_id,
        "target": note.target,
        "outcome": note.outcome,
        "category": note.category,
    }


def refuse_unverified(report: EvalReport) -> None:
    if not report.passed:
        raise UnverifiedKernelError(
            f"refusing to remember a kernel for task {report.task!r} on {report.target}: its report has "
            f"status={report.status} correct={report.correct}; only kernels that evaluated ok and correct "
            "are remembered"
        )


class Memory:
    """Remember verified kernels and notes; recall the ones most similar to a task."""

    def __init__(self, store: Store, vectors: VectorMemory, embedder: Embedder) -> None:
        self.store = store
        self.vectors = vectors
        self.embedder = embedder
        self._signatures: dict[tuple[str, str], TaskSignature] = {}
        self._in_doubt: dict[str, set[str]] = {}  # collection -> ids of vectors a failed write may have left

    @classmethod
    def open(
        cls, settings: Settings | None = None, *, busy_timeout_s: float = 30.0, for_reindex: bool = False
    ) -> Memory:
        """Open the store (``settings.resolved_store_url``) and Chroma (``chroma_url`` or the data dir).

        ``for_reindex`` opens collections filled by another embedding, which ``reindex`` then rebuilds.
        """
        settings = settings or load_settings()
        embedder = make_embedder(settings.embedding)
        store = Store.open(settings.resolved_store_url, busy_timeout_s=busy_timeout_s)
        try:
            vectors = VectorMemory.open(
                url=settings.chroma_url,
                path=None if settings.chroma_url else settings.chroma_path,
                embedding=embedder.name,
                dim=embedder.dim,
                check_embedding=not for_reindex,
            )
        except BaseException:
            store.close()
            raise
        return cls(store, vectors, embedder)

    def close(self) -> None:
        self.vectors.close()
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- task signatures ------------------------------------------------------------------------

    def signature(self, task: TaskLike) -> TaskSignature:
        """The structural signature of a task, traced once and then cached in the store."""
        if isinstance(task, TaskSignature):
            return task
        if isinstance(task, Task):
            return self._task_signature(task)
        try:
            loaded = load_task(task)
        except TaskError:
            known = self.store.get_task(str(task))
            if known is not None and known.signature is not None:
                return known.signature
            raise RecordNotFoundError(
                f"{task}: not a suite task or task folder, and no task of that id in {self.store.where}"
            ) from None
        return self._task_signature(loaded)

    def _task_signature(self, task: Task) -> TaskSignature:
        key = (task.id, task.source_digest)
        cached = self._signatures.get(key)
        if cached is not None:
            return cached
        known = self.store.get_task(task.id)
        if known is not None and known.signature is not None and known.source_digest == task.source_digest:
            signature = known.signature
        else:
            signature = task_signature(task)
            self.store.ensure_task(
                task.id,
                name=task.spec.name,
                category=task.spec.category,
                source_digest=task.source_digest,
                signature=signature,
            )
        self._signatures[key] = signature
        return signature

    def _save_signature(self, tx: StoreTx, signature: TaskSignature) -> None:
        """Cache a traced signature with its task (a bare one, without primitives, is not worth it)."""
        if signature.task_id and signature.primitives:
            tx.ensure_task(
                signature.task_id, category=signature.category, signature=signature, overwrite=False
            )

    # -- kernels --------------------------------------------------------------------------------

    def remember_kernel(
        self,
        report: EvalReport,
        code: str,
        *,
        task: TaskLike | None = None,
        strategy: str = "",
        produced_by: str = "",
        session_id: str | None = None,
        candidate_id: str | None = None,
        parent_id: str | None = None,
    ) -> KernelRecord:
        """Remember a kernel whose report passed; raises ``UnverifiedKernelError`` otherwise.

        ``task`` defaults to the report's task id (a suite id or a folder path).
        """
        refuse_unverified(report)
        entry = NewKernel(
            task_id="",
            code=code,
            report=report,
            strategy=strategy,
            produced_by=produced_by,
            session_id=session_id,
            candidate_id=candidate_id,
            parent_id=parent_id,
        )
        return self.remember_kernels([entry], tasks=[task if task is not None else report.task])[0]

    def remember_kernels(
        self, entries: Sequence[NewKernel], *, tasks: Sequence[TaskLike | None] | None = None
    ) -> list[KernelRecord]:
        """Remember many verified kernels in one transaction (bulk loads, imports, benchmarks).

        ``tasks[i]`` gives entry i's task when its ``task_id`` alone cannot be resolved. All entries
        are checked before anything is written: one unverified report refuses the whole batch.
        """
        results = self.store_kernels(entries, tasks=tasks)
        records = self.store.kernels([kid for kid, _ in results])
        return [records[kid] for kid, _ in results]

    def store_kernels(
        self, entries: Sequence[NewKernel], *, tasks: Sequence[TaskLike | None] | None = None
    ) -> list[tuple[str, bool]]:
        """Like ``remember_kernels``, returning ``(id, newly added)`` pairs instead of records."""
        for entry in entries:
            refuse_unverified(entry.report)
            if not entry.code.strip():
                raise MemoryStoreError(f"refusing to remember an empty kernel for task {entry.report.task!r}")
        tasks = tasks or [None] * len(entries)
        signatures = [self.signature(t if t is not None else e.task_id) for e, t in zip(entries, tasks)]
        entries = [
            e.model_copy(update={"task_id": s.task_id or e.task_id or e.report.task})
            for e, s in zip(entries, signatures)
        ]
        with self.store.write("remembering kernels") as tx:
            for signature in {s.task_id: s for s in signatures}.values():
                self._save_signature(tx, signature)
            results = tx.add_kernels(entries)
            vectors = [
                self.embedder.embed(sig, kernel_text(e.strategy, e.code)) for e, sig in zip(entries, signatures)
            ]
            self._upsert(
                KERNELS,
                [kid for kid, _ in results],
                vectors,
                [kernel_metadata(e.task_id, e.report, e.strategy, s) for e, s in zip(entries, signatures)],
            )
        self._settle_in_doubt()
        added = sum(1 for _, new in results if new)
        log.debug("memory.kernels_remembered", added=added, already_known=len(results) - added)
        return results

    # -- vectors whose records never committed ----------------------------------------------------

    def _upsert(self, collection: str, ids: list[str], vectors: Sequence[object],
                metadatas: Sequence[dict[str, object]]) -> None:
        """Store vectors inside a record's transaction, tagged with their writer. When Chroma fails, the
        records roll back, but the server may have stored the vectors before it failed to answer: their ids
        are kept in doubt, and forgotten once Chroma answers again (``_settle_in_doubt``)."""
        tagged = [{**m, WRITER: writer_name()} for m in metadatas]
        try:
            self.vectors.upsert(collection, ids, vectors, tagged)  # type: ignore[arg-type]
        except VectorStoreError:
            self._in_doubt.setdefault(collection, set()).update(ids)
            raise

    def _settle_in_doubt(self) -> None:
        """Forget the vectors of failed writes whose records never committed (after a write that went
        through, when Chroma answers); those it cannot reach yet stay in doubt for the next write."""
        for collection, ids in list(self._in_doubt.items()):
            try:
                self._forget_if_unrecorded(collection, sorted(ids))
            except (VectorStoreError, MemoryStoreError) as exc:
                log.warning("memory.in_doubt_kept", collection=collection, ids=len(ids), error=str(exc)[:200])
                continue
            del self._in_doubt[collection]

    def _forget_if_unrecorded(self, collection: str, ids: list[str]) -> int:
        """Delete those of ``ids`` that have a vector in ``collection`` but no record in SQL."""
        if not ids:
            return 0
        recorded = self.store.kernels(ids) if collection == KERNELS else self.store.notes(ids)
        unrecorded = [i for i in ids if i not in recorded]
        self.vectors.delete(collection, unrecorded)
        if unrecorded:
            log.info("memory.unrecorded_vectors_forgotten", collection=collection, ids=unrecorded)
        return len(unrecorded)

    def forget_unrecorded(self, writer: str) -> int:
        """Forget the vectors that ``writer`` (a process's ``host:pid``, see ``writer_name``) stored and whose
        records never committed: call it only for a writer known to be dead (a live one may be between its
        vector and its commit). How many were forgotten."""
        return sum(self._forget_if_unrecorded(c, self.vectors.ids_where(c, {WRITER: writer})) for c in COLLECTIONS)

    def recall_kernels(self, task: TaskLike, k: int = 5, target: str | None = None) -> list[KernelHit]:
        """The ``k`` remembered kernels most similar to ``task`` (on ``target`` if given), best first."""
        query = self.embedder.embed(self.signature(task))
        hits = self.vectors.query(KERNELS, query, k, where={"target": target} if target else None)
        return self._kernel_hits(hits)

    def _kernel_hits(self, hits: Sequence[VectorHit]) -> list[KernelHit]:
        records = self.store.kernels([h.id for h in hits])
        missing = [h.id for h in hits if h.id not in records]
        if missing:
            log.warning("memory.orphan_vectors", collection=KERNELS, ids=missing)
        return [KernelHit(score=h.score, kernel=records[h.id]) for h in hits if h.id in records]

    # -- notes ----------------------------------------------------------------------------------

    def remember_note(
        self,
        text: str,
        *,
        task: TaskLike | None = None,
        outcome: Outcome = "info",
        target: str | None = None,
        pattern: str = "",
        session_id: str | None = None,
    ) -> NoteRecord:
        """Remember a short lesson; ``pattern`` (e.g. ``matmul+gelu``) defaults to the task's op pattern."""
        if not text.strip():
            raise MemoryStoreError("refusing to remember an empty note")
        signature = self.signature(task) if task is not None else None
        return self._store_note(
            signature,
            text=text.strip(),
            outcome=outcome,
            pattern=pattern or (signature.pattern if signature else ""),
            task_id=(signature.task_id or None) if signature else None,
            target=target,
            category=signature.category if signature else None,
            session_id=session_id,
        )

    def import_note(self, note: NoteRecord) -> NoteRecord:
        """Store a note read from an export file, keeping its id and date."""
        signature = None
        if note.task_id:
            known = self.store.get_task(note.task_id)
            signature = known.signature if known else None
        return self._store_note(signature, **note.model_dump())

    def _store_note(self, signature: TaskSignature | None, **fields: object) -> NoteRecord:
        with self.store.write("remembering a note") as tx:
            same = tx.same_note(str(fields["text"]), fields.get("task_id"), fields.get("target"))  # type: ignore[arg-type]
            if same is not None:  # a resumed run saying the same thing again adds nothing
                return same
            if signature is not None:
                self._save_signature(tx, signature)
            note = tx.add_note(**fields)  # type: ignore[arg-type]
            vector = self.embedder.embed(signature, note.text, alias_features(note.pattern))
            self._upsert(NOTES, [note.id], [vector], [note_metadata(note)])
        self._settle_in_doubt()
        return note

    def recall_notes(self, task: TaskLike, k: int = 5, target: str | None = None) -> list[NoteHit]:
        """The ``k`` notes most relevant to ``task``, best first."""
        query = self.embedder.embed(self.signature(task))
        hits = self.vectors.query(NOTES, query, k, where={"target": target} if target else None)
        return self._note_hits(hits)

    def _note_hits(self, hits: Sequence[VectorHit]) -> list[NoteHit]:
        records = self.store.notes([h.id for h in hits])
        return [NoteHit(score=h.score, note=records[h.id]) for h in hits if h.id in records]

    # -- what was measured ---------------------------------------------------------------------

    def measured_count(self) -> int:
        """How many judged drafts and tuning reports the log holds: the store's size for retraining."""
        return self.store.count_events([*JUDGED, TUNED])

    def measurements(self, target: str | None = None, task_ids: Sequence[str] | None = None) -> list[Measurement]:
        """Every measured configuration in the event log (on ``target`` and of ``task_ids`` if given)."""
        events = self.store.events_of([PLANNED, *JUDGED, TUNED], task_ids=task_ids)
        rows = measurements_from_events(events)
        return [r for r in rows if target is None or r.target == target]

    def signatures(self, task_ids: Sequence[str]) -> dict[str, TaskSignature]:
        """Stored signatures of these tasks, tracing (and caching) those that can still be loaded."""
        found = self._stored_signatures(set(task_ids))
        for task_id in set(task_ids) - set(found):
            try:
                found[task_id] = self.signature(task_id)
            except (RecordNotFoundError, TaskError, SignatureError) as exc:
                log.debug("memory.signature_unavailable", task=task_id, error=str(exc))
        return found

    def nearest_measured(
        self, task: TaskLike, target: str, k: int = 5
    ) -> tuple[list[TaskMatch], list[Measurement]]:
        """The ``k`` tasks measured on ``target`` that are structurally closest to ``task`` (by the same
        embedding that recall uses, which holds the shape class; tasks of another op family count half),
        and their measurements. Only the nearest tasks' events are read."""
        ids = self.store.event_task_ids([*JUDGED, TUNED])
        signatures = self.signatures(ids)
        vectors = {tid: self.embedder.embed(sig) for tid, sig in signatures.items()}
        families = {tid: op_family(sig.primitives) for tid, sig in signatures.items()}
        query = self.signature(task)
        ranked = rank_tasks(self.embedder.embed(query), vectors, len(vectors), families, op_family(query.primitives))
        matches: list[TaskMatch] = []
        rows: list[Measurement] = []
        step = max(2 * k, 1)
        for start in range(0, len(ranked), step):
            chunk = ranked[start : start + step]
            found = self.measurements(target, [m.task_id for m in chunk])
            have = {r.task_id for r in found}
            matches += [m for m in chunk if m.task_id in have]
            rows += found
            if len(matches) >= k:
                break
        matches = matches[:k]
        keep = {m.task_id for m in matches}
        return matches, [r for r in rows if r.task_id in keep]

    def similar_tasks(self, task: TaskLike, k: int = 5, target: str = "cpu") -> list[TaskMatch]:
        """The ``k`` tasks measured on ``target`` nearest to ``task``, nearest first."""
        return self.nearest_measured(task, target, k)[0]

    def strategy_outcomes(self, task: TaskLike, target: str, k: int = 5) -> list[StrategyOutcome]:
        """How each strategy fared on the ``k`` measured tasks nearest to ``task`` on ``target``."""
        matches, rows = self.nearest_measured(task, target, k)
        return strategy_outcomes(rows, matches)

    # -- browsing -------------------------------------------------------------------------------

    def search(self, query: str, k: int = 10, kind: Kind = "all") -> list[KernelHit | NoteHit]:
        """Free-text search ("matmul gelu epilogue"), or by task when ``query`` names one."""
        try:
            vector = self.embedder.embed(self.signature(query))
        except (RecordNotFoundError, TaskError, SignatureError):
            vector = self.embedder.embed(None, query, alias_features(query))
        hits: list[KernelHit | NoteHit] = []
        if kind in ("all", "kernels"):
            hits.extend(self._kernel_hits(self.vectors.query(KERNELS, vector, k)))
        if kind in ("all", "notes"):
            hits.extend(self._note_hits(self.vectors.query(NOTES, vector, k)))
        return sorted(hits, key=lambda h: -h.score)[:k]

    def get(self, id_or_prefix: str) -> KernelRecord | NoteRecord:
        kind, full_id = self.store.resolve_id(id_or_prefix)
        found = self.store.kernels([full_id]) if kind == "kernel" else self.store.notes([full_id])
        return found[full_id]

    def stats(self) -> MemoryStats:
        return MemoryStats(
            store=self.store.stats(),
            vectors_where=self.vectors.where,
            embedding=self.embedder.name,
            kernel_vectors=self.vectors.count(KERNELS),
            note_vectors=self.vectors.count(NOTES),
        )

    def reindex(self) -> tuple[int, int]:
        """Rebuild both collections from the SQL records (after an embedding change or a lost
        Chroma directory); returns (kernels, notes) indexed."""
        self.vectors.rebuild()
        kernels = notes = 0
        for batch in self.store.iter_kernels():
            sigs = self._stored_signatures({k.task_id for k in batch})
            self.vectors.upsert(
                KERNELS,
                [k.id for k in batch],
                [self.embedder.embed(sigs.get(k.task_id), kernel_text(k.strategy, k.code)) for k in batch],
                [kernel_metadata(k.task_id, k.report, k.strategy, sigs.get(k.task_id)) for k in batch],
            )
            kernels += len(batch)
        for batch in self.store.iter_notes():
            sigs = self._stored_signatures({n.task_id for n in batch if n.task_id})
            self.vectors.upsert(
                NOTES,
                [n.id for n in batch],
                [
                    self.embedder.embed(sigs.get(n.task_id or ""), n.text, alias_features(n.pattern))
                    for n in batch
                ],
                [note_metadata(n) for n in batch],
            )
            notes += len(batch)
        log.info("memory.reindexed", kernels=kernels, notes=notes)
        return kernels, notes

    def _stored_signatures(self, task_ids: set[str]) -> dict[str, TaskSignature]:
        return {tid: info.signature for tid, info in self.store.tasks(list(task_ids)).items() if info.signature}
