"""What the actors of one process share: settings, tasks, the evaluator, the store, memory, model clients.

Everything is opened on first use, so a gRPC worker that hosts only the tester never opens Chroma, and
one that hosts only planners never starts evaluator workers.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import structlog

from actors.config import ActorConfig
from maxkernel.config import Settings, load_settings
from maxkernel.llm.meter import Ledger
from maxkernel.messages import Budget

if TYPE_CHECKING:
    from autogen_core.models import ChatCompletionClient
    from jaxbench.evaluate import Evaluator
    from jaxbench.task import Task
    from memory import Memory, Store

log = structlog.get_logger("actors.services")


class Services:
    def __init__(self, config: ActorConfig, *, evaluator: "Evaluator | None" = None,
                 memory: "Memory | None" = None, store: "Store | None" = None,
                 actors: dict[str, type] | None = None) -> None:
        self.config = config
        # A role served by another class in this process (a daemon's tester that hands drafts to the fleet).
        self.actor_classes: dict[str, type] = dict(actors or {})
        self.settings: Settings = load_settings(
            data_dir=config.data_dir, store_url=config.store_url, eval_timing_rounds=config.eval_timing_rounds,
            eval_correctness_seeds=config.eval_correctness_seeds, eval_timeout_s=config.eval_timeout_s)
        self._evaluator, self._owns_evaluator = evaluator, evaluator is None
        self._memory, self._owns_memory = memory, memory is None
        self._store, self._owns_store = store, store is None
        self._untimed: "Evaluator | None" = None
        self._tasks: dict[str, "Task"] = {}
        self._ledgers: dict[str, Ledger] = {}
        self._clients: dict[tuple[str, str], "ChatCompletionClient"] = {}
        self._lock = threading.Lock()

    def task(self, task_id: str) -> "Task":
        """A suite id or a task folder. A folder's task is kept under its id too: messages name tasks by id,
        and the actors of this process must find a folder task by the id its messages carry. So a folder may
        not take a suite task's id unless it is that task's copy (``check_own_id``): else a daemon that ran
        it would later serve the suite id with the folder's files."""
        from jaxbench.task import TaskError, check_own_id, load_task

        with self._lock:
            if task_id not in self._tasks:
                task = load_task(task_id)
                check_own_id(task)
                held = self._tasks.get(task.id)
                if held is not None and held.source_digest != task.source_digest:
                    raise TaskError(f"{task.path}: its task.yaml id {task.id} already names {held.path} in this "
                                    f"process, a different task; give the folder an id of its own")
                self._tasks[task_id] = task
                self._tasks.setdefault(task.id, task)
            return self._tasks[task_id]

    @property
    def evaluator(self) -> "Evaluator":
        with self._lock:
            if self._evaluator is None:
                from maxkernel.evaluation import evaluator_from

                self._evaluator = evaluator_from(self.settings)
            return self._evaluator

    @property
    def untimed_evaluator(self) -> "Evaluator":
        """A twin of ``evaluator`` on the same worker pool that checks correctness only (no timing rounds)."""
        evaluator = self.evaluator
        with self._lock:
            if self._untimed is None or self._untimed.pool is not evaluator.pool:
                import dataclasses

                from jaxbench.evaluate import Evaluator

                self._untimed = Evaluator(pool=evaluator.pool, config=dataclasses.replace(evaluator.config, timing=False))
            return self._untimed

    @property
    def store(self) -> "Store":
        with self._lock:
            if self._store is None:
                from memory import Store

                self._store = Store.open(self.settings.resolved_store_url)
            return self._store

    @property
    def memory(self) -> "Memory":
        with self._lock:
            if self._memory is None:
                self._memory = self.open_memory()
            return self._memory

    def open_memory(self) -> "Memory":
        """Open the memory of the settings (a daemon's waits out a restarting Chroma server)."""
        from memory import Memory

        return Memory.open(self.settings)

    def ledger(self, session_id: str, budget: Budget) -> Ledger:
        """The session's ledger, booking to the store's so that its budget binds every process."""
        store = self.store if session_id not in self._ledgers else None
        with self._lock:
            if session_id not in self._ledgers:
                self._ledgers[session_id] = Ledger(max_tokens=budget.max_tokens, max_cost_usd=budget.max_cost_usd,
                                                   shared=store, scope=session_id)
            return self._ledgers[session_id]

    def client(self, session_id: str, role: str, budget: Budget) -> "ChatCompletionClient":
        """The metered client of one role in one session; kept across actor restarts so that a replay
        transcript is not started over."""
        from maxkernel.llm.factory import make_client
        from maxkernel.llm.presets import models

        key = (session_id, role)
        if key not in self._clients:
            preset = models().preset(self.config.model_for(role))
            if self.config.base_url:
                preset = preset.model_copy(update={"base_url": self.config.base_url})
            self._clients[key] = make_client(
                preset, role, self.ledger(session_id, budget), transcript=self.config.transcript,
                record_to=self.config.record_to, base_delay_s=self.config.retry_base_delay_s)
        return self._clients[key]

    async def aclose(self) -> None:
        for client in self._clients.values():
            try:
                await client.close()
            except Exception as exc:  # a client that cannot close cleanly must not hide the session's result
                log.warning("services.client_close_failed", error=str(exc))
        self._clients.clear()
        if self._evaluator is not None and self._owns_evaluator:
            self._evaluator.close()
        if self._memory is not None and self._owns_memory:
            self._memory.close()
        if self._store is not None and self._owns_store:
            self._store.close()

