"""A daemon job carried on over two sessions: the note it leaves in memory and its report give the same
evaluations and the same per-strategy speedups, both read from the event log."""

from __future__ import annotations

import pytest
import asyncio

from actors.config import ActorConfig
from actors.services import Services
from maxkernel.messages import new_id
from orchestrators.auto import AutoBudget, messages_of, run_auto
from orchestrators.jobs import JobQueue, JobSpec
from orchestrators.report import gather
from orchestrators.report_data import contributions

NORM = "12p_RMSNorm"


@pytest.mark.slow
def test_a_resumed_jobs_note_and_report_agree(orch_evaluator: object) -> None:
    services = Services(ActorConfig(remember=False), evaluator=orch_evaluator)  # type: ignore[arg-type]
    try:
        queue = JobQueue(services.store.engine)
        budget = AutoBudget(time_s=60, max_evaluations=3, tune_max_trials=1, tune_budget_s=5)
        job = queue.submit(JobSpec(task=NORM, budget=budget))
        first, second = new_id(), new_id()
        queue.started(job.id, first)  # as the daemon runs a job, then runs it again after an interruption
        asyncio.run(run_auto(NORM, services=services, budget=budget, session_id=first, mode="daemon"))
        queue.started(job.id, second)
        prior = messages_of(services.store, [first])
        result = asyncio.run(run_auto(NORM, services=services, budget=budget, session_id=second, mode="daemon",
                                      prior=prior))
        assert result.remembered_note is not None
        note = services.memory.get(result.remembered_note).text  # type: ignore[union-attr]

        data = gather(services.store, job.id)
        assert data.kind == "job" and len(data.nodes) == data.facts["evaluations"] > 0
        assert result.resumed_evaluations > 0  # the second session carried the first one's work on
        assert f"{data.facts['evaluations']} evaluations" in note, note
        rows = contributions(data.nodes)
        assert rows and all(row.line() in note for row in rows), note
    finally:
        services.store.close()
        services.memory.close()
