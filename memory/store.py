"""The SQL store: tasks, sessions, candidates, evaluations, the event log, kernels, notes and the ledger.

One SQLite file by default (WAL mode), PostgreSQL by URL when several machines share it; the same
code and schema serve both. Opening a store applies the pending Alembic migrations. Every driver
failure leaves as a ``MemoryStoreError`` subclass whose message names what failed and where.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
import structlog
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from jaxbench.report import EvalReport
from maxkernel.analysis.signature import TaskSignature
from memory import migrate
from memory.engine import WRITE, create_store_engine, describe, parse_url, translate
from memory.errors import MemoryStoreError, RecordNotFoundError
from memory.ids import resolve_prefix
from memory.models import (
    CandidateInfo,
    EvaluationInfo,
    EventIn,
    EventRecord,
    KernelRecord,
    NewKernel,
    NoteRecord,
    Outcome,
    SessionInfo,
    Spend,
    StoreStats,
    TaskInfo,
)
from memory.schema import (
    CandidateRow,
    EvaluationRow,
    EventRow,
    KernelRow,
    LedgerRow,
    NoteRow,
    SessionRow,
    TaskRow,
    UTCDateTime,
    new_id,
    utcnow,
)

log = structlog.get_logger(__name__)


def _spend(session: Session, scope: str) -> Spend:
    calls, tokens, cost = session.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(LedgerRow.tokens_in + LedgerRow.tokens_out), 0),
                  sa.func.coalesce(sa.func.sum(LedgerRow.cost_usd), 0.0)).where(LedgerRow.scope == scope)).one()
    return Spend(scope=scope, calls=int(calls), tokens=int(tokens), cost_usd=float(cost))


def code_sha(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def _task_info(row: TaskRow) -> TaskInfo:
    signature = TaskSignature.model_validate(row.signature) if row.signature else None
    return TaskInfo(
        id=row.id, name=row.name, category=row.category, source_digest=row.source_digest, signature=signature
    )


def _pattern(task: TaskRow) -> str:
    return TaskSignature.model_validate(task.signature).pattern if task.signature else ""


def _kernel_records(rows: Sequence[Any]) -> list[KernelRecord]:
    """Records from (kernel, candidate, evaluation, task) rows; each task's signature parsed once."""
    patterns: dict[str, str] = {}
    out = []
    for k, c, e, t in rows:
        if t.id not in patterns:
            patterns[t.id] = _pattern(t)
        out.append(
            KernelRecord(
                id=k.id,
                task_id=k.task_id,
                target=k.target,
                speedup=k.speedup,
                kernel_ms=e.kernel_ms,
                ref_ms=e.ref_ms,
                basis=e.basis,
                strategy=k.strategy,
                produced_by=c.produced_by,
                category=t.category,
                pattern=patterns[t.id],
                candidate_id=c.id,
                evaluation_id=e.id,
                session_id=c.session_id,
                parent_id=c.parent_id,
                code=c.code,
                report=EvalReport.model_validate(e.report),
                created_at=k.created_at,
            )
        )
    return out


def _contains(text: str, *columns: Any) -> Any:
    """Any of ``columns`` contains ``text``, whatever the case (``%`` and ``_`` in it taken literally)."""
    pattern = "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return sa.or_(*(sa.func.lower(c).like(pattern, escape="\\") for c in columns))


def _after(last: tuple[Any, str]) -> Any:
    """The keyset bound of the previous page: (created_at, id), typed like the columns."""
    return sa.tuple_(sa.literal(last[0], UTCDateTime()), sa.literal(last[1], sa.String()))


_KERNEL_JOIN = (
    sa.select(KernelRow, CandidateRow, EvaluationRow, TaskRow)
    .join(CandidateRow, KernelRow.candidate_id == CandidateRow.id)
    .join(EvaluationRow, KernelRow.evaluation_id == EvaluationRow.id)
    .join(TaskRow, KernelRow.task_id == TaskRow.id)
)


# Arbitrary constant: the PostgreSQL advisory lock that writers of kernels take in turn ("MKKRN").
KERNEL_WRITES_LOCK = 0x4D4B4B524E


class StoreTx:
    """The writes of one transaction; obtained from ``Store.write()``, committed when it ends."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._tasks: set[str] = set()

    def ensure_task(
        self,
        task_id: str,
        *,
        name: str = "",
        category: str | None = None,
        source_digest: str = "",
        signature: TaskSignature | None = None,
        overwrite: bool = True,
    ) -> None:
        """Insert the task, or refresh what is known of it (unless ``overwrite`` is false, a new
        digest or signature replaces the stored one)."""
        if task_id in self._tasks and signature is None and not (name or category or source_digest):
            return
        row = self.session.get(TaskRow, task_id)
        sig = signature.model_dump(mode="json") if signature is not None else None
        self._tasks.add(task_id)
        if row is None:
            self.session.add(
                TaskRow(
                    id=task_id,
                    name=name or task_id,
                    category=category,
                    source_digest=source_digest,
                    signature=sig,
                )
            )
            self.session.flush()
            return
        if not overwrite and row.signature is not None:
            return
        if name:
            row.name = name
        if category:
            row.category = category
        if source_digest:
            row.source_digest = source_digest
        if sig is not None:
            row.signature = sig

    def add_candidate(
        self,
        task_id: str,
        code: str,
        *,
        session_id: str | None = None,
        parent_id: str | None = None,
        strategy: str = "",
        produced_by: str = "",
        id: str | None = None,
    ) -> CandidateInfo:
        """Add a candidate; re-adding the same id with the same code returns the stored one (a message
        re-published on the bus is recorded once)."""
        if id is not None:
            existing = self.session.get(CandidateRow, id)
            if existing is not None:
                if existing.code != code:
                    raise ValueError(f"candidate {id} already exists with different code")
                return CandidateInfo.model_validate(existing)
        self.ensure_task(task_id)
        row = CandidateRow(
            id=id or new_id(),
            task_id=task_id,
            session_id=session_id,
            parent_id=parent_id,
            code=code,
            code_sha=code_sha(code),
            strategy=strategy,
            produced_by=produced_by,
        )
        self.session.add(row)
        self.session.flush()
        return CandidateInfo.model_validate(row)

    def add_evaluation(self, candidate_id: str, report: EvalReport, *, id: str | None = None) -> EvaluationInfo:
        row = EvaluationRow(
            id=id or new_id(),
            candidate_id=candidate_id,
            task_id=report.task,
            target=report.target,
            size=report.size,
            status=report.status,
            correct=report.correct,
            speedup=report.speedup,
            kernel_ms=report.kernel_ms,
            ref_ms=report.ref_ms,
            basis=report.basis,
            report=report.model_dump(mode="json"),
        )
        self.session.add(row)
        self.session.flush()
        return EvaluationInfo(id=row.id, candidate_id=candidate_id, report=report, created_at=row.created_at)

    def add_kernels(self, entries: Sequence[NewKernel]) -> list[tuple[str, bool]]:
        """Store verified kernels in bulk: ``(kernel id, newly added)`` for each entry, in order.

        A kernel already stored (same id, or same task, target and code) is not stored twice: its
        existing id comes back. Rows go in as three multi-row INSERTs for the whole batch.
        """
        if not entries:
            return []
        if self.session.get_bind().dialect.name == "postgresql":
            # Writers of kernels take turns (as SQLite's BEGIN IMMEDIATE makes every writer do): two
            # daemons remembering the same kernel would otherwise both miss it below and the second
            # insert would fail on the (code, task, target) key instead of finding the first.
            self.session.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": KERNEL_WRITES_LOCK})
        shas = [code_sha(e.code) for e in entries]
        existing: dict[tuple[str, str, str], str] = {}
        known_ids: set[str] = set()
        for start in range(0, len(entries), 500):
            chunk = list(set(shas[start : start + 500]))
            for kid, task_id, target, sha in self.session.execute(
                sa.select(KernelRow.id, KernelRow.task_id, KernelRow.target, KernelRow.code_sha).where(
                    KernelRow.code_sha.in_(chunk)
                )
            ):
                existing[(task_id, target, sha)] = kid
            ids = [e.id for e in entries[start : start + 500]]
            known_ids.update(self.session.scalars(sa.select(KernelRow.id).where(KernelRow.id.in_(ids))))
        reused = {
            cid: sha
            for cid, sha in self.session.execute(
                sa.select(CandidateRow.id, CandidateRow.code_sha).where(
                    CandidateRow.id.in_([e.candidate_id for e in entries if e.candidate_id])
                )
            )
        }
        out: list[tuple[str, bool]] = []
        candidates: list[dict[str, Any]] = []
        evaluations: list[dict[str, Any]] = []
        kernels: list[dict[str, Any]] = []
        now = utcnow()
        for entry, sha in zip(entries, shas):
            key = (entry.task_id, entry.report.target, sha)
            if entry.id in known_ids:
                out.append((entry.id, False))
                continue
            if key in existing:
                out.append((existing[key], False))
                continue
            self.ensure_task(entry.task_id)
            created = entry.created_at or now
            candidate_id = entry.candidate_id or new_id()
            if candidate_id in reused:
                if reused[candidate_id] != sha:
                    raise MemoryStoreError(
                        f"candidate {candidate_id} is already stored with different code; "
                        "a remembered kernel must be the code that was evaluated"
                    )
            else:
                candidates.append(
                    {
                        "id": candidate_id,
                        "task_id": entry.task_id,
                        "session_id": entry.session_id,
                        "parent_id": entry.parent_id,
                        "code": entry.code,
                        "code_sha": sha,
                        "strategy": entry.strategy,
                        "produced_by": entry.produced_by,
                        "created_at": created,
                    }
                )
                reused[candidate_id] = sha
            report = entry.report
            evaluation_id = new_id()
            evaluations.append(
                {
                    "id": evaluation_id,
                    "candidate_id": candidate_id,
                    "task_id": report.task,
                    "target": report.target,
                    "size": report.size,
                    "status": report.status,
                    "correct": report.correct,
                    "speedup": report.speedup,
                    "kernel_ms": report.kernel_ms,
                    "ref_ms": report.ref_ms,
                    "basis": report.basis,
                    "report": report.model_dump(mode="json"),
                    "created_at": created,
                }
            )
            kernels.append(
                {
                    "id": entry.id,
                    "task_id": entry.task_id,
                    "candidate_id": candidate_id,
                    "evaluation_id": evaluation_id,
                    "target": report.target,
                    "speedup": report.speedup,
                    "strategy": entry.strategy,
                    "code_sha": sha,
                    "created_at": created,
                }
            )
            existing[key] = entry.id
            known_ids.add(entry.id)
            out.append((entry.id, True))
        self.session.flush()  # the tasks, before the rows that refer to them
        for model, rows in ((CandidateRow, candidates), (EvaluationRow, evaluations), (KernelRow, kernels)):
            if rows:
                self.session.execute(sa.insert(model), rows)
        return out

    def same_note(self, text: str, task_id: str | None, target: str | None) -> NoteRecord | None:
        """The note already holding ``text`` for this task and target, if any: a note is stored once."""
        query = sa.select(NoteRow).where(NoteRow.text == text, NoteRow.task_id.is_(None) if task_id is None
                                         else NoteRow.task_id == task_id,
                                         NoteRow.target.is_(None) if target is None else NoteRow.target == target)
        row = self.session.scalars(query.limit(1)).first()
        return NoteRecord.model_validate(row) if row is not None else None

    def add_note(
        self,
        text: str,
        *,
        outcome: Outcome = "info",
        pattern: str = "",
        task_id: str | None = None,
        target: str | None = None,
        category: str | None = None,
        session_id: str | None = None,
        id: str | None = None,
        created_at: datetime | None = None,
    ) -> NoteRecord:
        if task_id is not None:
            self.ensure_task(task_id)
        row = NoteRow(
            **({"created_at": created_at} if created_at else {}),
            id=id or new_id(),
            text=text,
            outcome=outcome,
            pattern=pattern,
            task_id=task_id,
            target=target,
            category=category,
            session_id=session_id,
        )
        self.session.add(row)
        self.session.flush()
        return NoteRecord.model_validate(row)

    def create_session(
        self,
        *,
        mode: str,
        brain: str,
        target: str,
        budget: dict[str, Any] | None = None,
        task_id: str | None = None,
        status: str = "running",
        id: str | None = None,
    ) -> SessionInfo:
        row = SessionRow(
            id=id or new_id(),
            task_id=task_id,
            mode=mode,
            brain=brain,
            target=target,
            budget=budget or {},
            status=status,
        )
        self.session.add(row)
        self.session.flush()
        return SessionInfo.model_validate(row)

    def set_session_status(self, session_id: str, status: str) -> None:
        row = self.session.get(SessionRow, session_id)
        if row is None:
            raise RecordNotFoundError(f"no session {session_id!r}")
        row.status = status

    def append_events(self, events: Sequence[EventIn]) -> list[int]:
        """Append in order; returns the sequence numbers.

        On PostgreSQL the table lock makes commit order equal sequence order, so a reader that
        follows ``seq`` never skips an event committed late.
        """
        if not events:
            return []
        if self.session.get_bind().dialect.name == "postgresql":
            self.session.execute(sa.text("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE"))
        rows = [EventRow(**event.model_dump()) for event in events]
        self.session.add_all(rows)
        self.session.flush()
        return [row.seq for row in rows]


class Store:
    """The SQL half of the memory. Open it with ``Store.open(url)``; close it when done."""

    def __init__(self, engine: sa.Engine, where: str, revision: str) -> None:
        self.engine = engine
        self.where = where
        self.revision = revision
        self._reads = sessionmaker(engine, expire_on_commit=False)
        self._writes = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)

    @classmethod
    def open(cls, url: str, *, busy_timeout_s: float = 30.0, connect_timeout_s: float = 10.0) -> Store:
        """Connect, check the schema revision, apply pending migrations."""
        parsed = parse_url(url)
        where = describe(parsed)
        engine = create_store_engine(parsed, busy_timeout_s=busy_timeout_s, connect_timeout_s=connect_timeout_s)
        try:
            revision = migrate.upgrade(engine, where)
        except MemoryStoreError:
            engine.dispose()
            raise
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            raise translate(exc, where, "opening") from exc
        log.debug("store.opened", where=where, revision=revision)
        return cls(engine, where, revision)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sa.exc.DBAPIError as exc:
            raise translate(exc, self.where, doing) from exc

    @contextmanager
    def write(self, doing: str = "writing") -> Iterator[StoreTx]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        with self._guard(doing), self._writes.begin() as session:
            yield StoreTx(session)

    @contextmanager
    def read(self, doing: str = "reading") -> Iterator[Session]:
        with self._guard(doing), self._reads() as session, session.begin():
            yield session

    # -- writes, one transaction each ---------------------------------------------------------

    def ensure_task(self, task_id: str, **fields: Any) -> None:
        with self.write("saving a task") as tx:
            tx.ensure_task(task_id, **fields)

    def create_session(self, **fields: Any) -> SessionInfo:
        with self.write("creating a session") as tx:
            return tx.create_session(**fields)

    def set_session_status(self, session_id: str, status: str) -> None:
        with self.write("updating a session") as tx:
            tx.set_session_status(session_id, status)

    def add_candidate(self, task_id: str, code: str, **fields: Any) -> CandidateInfo:
        with self.write("saving a candidate") as tx:
            return tx.add_candidate(task_id, code, **fields)

    def add_evaluation(self, candidate_id: str, report: EvalReport) -> EvaluationInfo:
        with self.write("saving an evaluation") as tx:
            return tx.add_evaluation(candidate_id, report)

    def add_note(self, text: str, **fields: Any) -> NoteRecord:
        with self.write("saving a note") as tx:
            return tx.add_note(text, **fields)

    def append_event(
        self,
        payload: BaseModel | dict[str, Any],
        *,
        message_type: str | None = None,
        session_id: str | None = None,
        correlation_id: str | None = None,
        task_id: str | None = None,
        candidate_id: str | None = None,
    ) -> int:
        """Record one bus message; a pydantic message is stored as its JSON form under its class name."""
        if isinstance(payload, BaseModel):
            message_type = message_type or type(payload).__name__
            data = payload.model_dump(mode="json")
        else:
            data = dict(payload)
        if not message_type:
            raise ValueError("message_type is required for a dict payload")
        event = EventIn(
            message_type=message_type,
            payload=data,
            session_id=session_id,
            correlation_id=correlation_id,
            task_id=task_id,
            candidate_id=candidate_id,
        )
        return self.append_events([event])[0]

    def append_events(self, events: Sequence[EventIn]) -> list[int]:
        with self.write("appending events") as tx:
            return tx.append_events(events)

    def book(self, scope: str, *, tokens_in: int, tokens_out: int, cost_usd: float, model: str = "",
             process: str = "") -> Spend:
        """Book one model call to the shared ledger and return the scope's total, this call included
        (in one transaction, so concurrent bookers each see a total that counts every earlier call)."""
        with self.write("booking to the ledger") as tx:
            tx.session.add(LedgerRow(scope=scope, process=process, model=model, tokens_in=tokens_in,
                                     tokens_out=tokens_out, cost_usd=cost_usd))
            tx.session.flush()
            return _spend(tx.session, scope)

    def spent(self, scope: str) -> Spend:
        """What every process has booked to ``scope``."""
        with self.read("reading the ledger") as s:
            return _spend(s, scope)

    # -- reads ----------------------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskInfo | None:
        with self.read() as s:
            row = s.get(TaskRow, task_id)
            return _task_info(row) if row is not None else None

    def tasks(self, ids: Sequence[str]) -> dict[str, TaskInfo]:
        with self.read() as s:
            rows = s.scalars(sa.select(TaskRow).where(TaskRow.id.in_(list(ids)))).all()
            return {row.id: _task_info(row) for row in rows}

    def get_session(self, session_id: str) -> SessionInfo:
        with self.read() as s:
            row = s.get(SessionRow, session_id)
            if row is None:
                raise RecordNotFoundError(f"no session {session_id!r} in {self.where}")
            return SessionInfo.model_validate(row)

    def sessions(self, *, status: str | None = None, limit: int = 100) -> list[SessionInfo]:
        with self.read() as s:
            query = sa.select(SessionRow).order_by(SessionRow.created_at.desc()).limit(limit)
            if status:
                query = query.where(SessionRow.status == status)
            return [SessionInfo.model_validate(r) for r in s.scalars(query)]

    def get_candidate(self, candidate_id: str) -> CandidateInfo:
        with self.read() as s:
            row = s.get(CandidateRow, candidate_id)
            if row is None:
                raise RecordNotFoundError(f"no candidate {candidate_id!r} in {self.where}")
            return CandidateInfo.model_validate(row)

    def evaluations(self, candidate_id: str) -> list[EvaluationInfo]:
        with self.read() as s:
            rows = s.scalars(
                sa.select(EvaluationRow)
                .where(EvaluationRow.candidate_id == candidate_id)
                .order_by(EvaluationRow.created_at)
            )
            return [
                EvaluationInfo(
                    id=r.id,
                    candidate_id=r.candidate_id,
                    report=EvalReport.model_validate(r.report),
                    created_at=r.created_at,
                )
                for r in rows
            ]

    def events(
        self,
        *,
        session_id: str | None = None,
        correlation_id: str | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """Events in recording order; ``after`` is the last ``seq`` already seen."""
        with self.read() as s:
            query = sa.select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq)
            if session_id is not None:
                query = query.where(EventRow.session_id == session_id)
            if correlation_id is not None:
                query = query.where(EventRow.correlation_id == correlation_id)
            if limit is not None:
                query = query.limit(limit)
            return [EventRecord.model_validate(r) for r in s.scalars(query)]

    def events_of(self, types: Sequence[str], *, task_ids: Sequence[str] | None = None) -> list[EventRecord]:
        """Events of these message types (of these tasks, if given), in recording order."""
        with self.read("reading events") as s:
            query = sa.select(EventRow).where(EventRow.message_type.in_(list(types))).order_by(EventRow.seq)
            if task_ids is not None:
                query = query.where(EventRow.task_id.in_(list(task_ids)))
            return [EventRecord.model_validate(r) for r in s.scalars(query)]

    def event_task_ids(self, types: Sequence[str]) -> list[str]:
        """The distinct tasks that have events of these message types."""
        with self.read("reading event tasks") as s:
            query = (sa.select(EventRow.task_id).where(EventRow.message_type.in_(list(types)))
                     .where(EventRow.task_id.is_not(None)).distinct())
            return sorted(str(t) for t in s.scalars(query))

    def count_events(self, types: Sequence[str]) -> int:
        """How many events of these message types the log holds (cheap: a count, nothing parsed)."""
        with self.read("counting events") as s:
            return int(s.scalar(sa.select(sa.func.count()).select_from(EventRow)
                                .where(EventRow.message_type.in_(list(types)))) or 0)

    def kernels(self, ids: Sequence[str]) -> dict[str, KernelRecord]:
        """The kernels with these ids (missing ids are absent from the result)."""
        if not ids:
            return {}
        with self.read() as s:
            rows = s.execute(_KERNEL_JOIN.where(KernelRow.id.in_(list(ids)))).all()
            return {record.id: record for record in _kernel_records(rows)}

    def list_kernels(
        self,
        *,
        task_id: str | None = None,
        target: str | None = None,
        limit: int | None = 50,
        offset: int = 0,
        text: str | None = None,
    ) -> list[KernelRecord]:
        """Newest first; ``text``: only kernels whose task, strategy or code contains it (any case)."""
        with self.read() as s:
            query = _KERNEL_JOIN.order_by(KernelRow.created_at.desc(), KernelRow.id).offset(offset)
            if task_id:
                query = query.where(KernelRow.task_id == task_id)
            if target:
                query = query.where(KernelRow.target == target)
            if text:
                query = query.where(_contains(text, KernelRow.task_id, KernelRow.strategy, CandidateRow.code))
            if limit is not None:
                query = query.limit(limit)
            return _kernel_records(s.execute(query).all())

    def notes(self, ids: Sequence[str]) -> dict[str, NoteRecord]:
        if not ids:
            return {}
        with self.read() as s:
            rows = s.scalars(sa.select(NoteRow).where(NoteRow.id.in_(list(ids))))
            return {r.id: NoteRecord.model_validate(r) for r in rows}

    def list_notes(
        self, *, task_id: str | None = None, limit: int | None = 50, offset: int = 0, text: str | None = None
    ) -> list[NoteRecord]:
        """Newest first; ``text``: only notes whose text, task or pattern contains it (any case)."""
        with self.read() as s:
            query = sa.select(NoteRow).order_by(NoteRow.created_at.desc(), NoteRow.id).offset(offset)
            if task_id:
                query = query.where(NoteRow.task_id == task_id)
            if text:
                query = query.where(_contains(text, NoteRow.text, NoteRow.task_id, NoteRow.pattern))
            if limit is not None:
                query = query.limit(limit)
            return [NoteRecord.model_validate(r) for r in s.scalars(query)]

    def iter_kernels(self, batch: int = 500) -> Iterator[list[KernelRecord]]:
        """All kernels, oldest first, in batches (export and reindex)."""
        last: tuple[Any, str] | None = None
        while True:
            with self.read() as s:
                query = _KERNEL_JOIN.order_by(KernelRow.created_at, KernelRow.id).limit(batch)
                if last is not None:
                    query = query.where(sa.tuple_(KernelRow.created_at, KernelRow.id) > _after(last))
                rows = s.execute(query).all()
            if not rows:
                return
            last = (rows[-1][0].created_at, rows[-1][0].id)
            yield _kernel_records(rows)

    def iter_notes(self, batch: int = 500) -> Iterator[list[NoteRecord]]:
        """All notes, oldest first, in batches."""
        last: tuple[Any, str] | None = None
        while True:
            with self.read() as s:
                query = sa.select(NoteRow).order_by(NoteRow.created_at, NoteRow.id).limit(batch)
                if last is not None:
                    query = query.where(sa.tuple_(NoteRow.created_at, NoteRow.id) > _after(last))
                records = [NoteRecord.model_validate(r) for r in s.scalars(query)]
            if not records:
                return
            last = (records[-1].created_at, records[-1].id)
            yield records

    def resolve_id(self, prefix: str) -> tuple[str, str]:
        """``("kernel"|"note", full id)`` for an id or a unique prefix of one."""
        return self.resolve(prefix, ("kernel", "note"))

    def resolve(self, prefix: str, kinds: Sequence[str] = ("kernel", "note", "session")) -> tuple[str, str]:
        """``(kind, full id)`` for an id or a unique prefix among the store's own records of ``kinds``."""
        columns = {"kernel": KernelRow.id, "note": NoteRow.id, "session": SessionRow.id}
        with self.read("looking up an id") as s:
            return resolve_prefix(s, [(k, columns[k]) for k in kinds], prefix, self.where)

    def stats(self) -> StoreStats:
        with self.read("counting") as s:
            counts = {
                name: s.scalar(sa.select(sa.func.count()).select_from(row))
                for name, row in (
                    ("tasks", TaskRow),
                    ("sessions", SessionRow),
                    ("candidates", CandidateRow),
                    ("evaluations", EvaluationRow),
                    ("events", EventRow),
                    ("kernels", KernelRow),
                    ("notes", NoteRow),
                )
            }
            by_target = dict(s.execute(sa.select(KernelRow.target, sa.func.count()).group_by(KernelRow.target)).all())
            by_category = dict(
                s.execute(
                    sa.select(TaskRow.category, sa.func.count())
                    .join(KernelRow, KernelRow.task_id == TaskRow.id)
                    .group_by(TaskRow.category)
                ).all()
            )
            reports = s.scalars(sa.select(EvaluationRow.report)
                                .join(KernelRow, KernelRow.evaluation_id == EvaluationRow.id)).all()
            best = max((EvalReport.model_validate(r) for r in reports), key=lambda r: r.low, default=None)
            revision = migrate.current_revision(s.connection())
        return StoreStats(
            where=self.where,
            schema_revision=revision,
            kernels_by_target={str(k): int(v) for k, v in by_target.items()},
            kernels_by_category={str(k or "-"): int(v) for k, v in by_category.items()},
            best_speedup=best.speedup if best is not None else None,
            best_speedup_ci=best.interval if best is not None else None,
            **{k: int(v or 0) for k, v in counts.items()},
        )
