"""A resumed search runs on to the larger limit it is given, keeps it, and memory keeps one note per finding."""

from __future__ import annotations

import asyncio

import pytest

from actors.config import ActorConfig
from actors.services import Services
from memory.errors import RecordNotFoundError
from orchestrators.search import SearchConfig, SearchLimits, run_search, stored_config

NORM = "12p_RMSNorm"


@pytest.mark.slow
def test_a_resume_extends_the_evaluations_and_stores_no_note_twice(orch_evaluator: object) -> None:
    services = Services(ActorConfig(remember=False), evaluator=orch_evaluator)  # type: ignore[arg-type]
    try:
        config = SearchConfig(algorithm="parallel", seed=1, max_evaluations=2, lanes=1)
        first = asyncio.run(run_search(NORM, config, services=services))
        assert first.evaluations == 2 and "2 of 2" in first.stop_reason

        # A resume given a larger --evals goes on from the stored graph to the new limit, and keeps it.
        more = asyncio.run(run_search(NORM, config, services=services, search_id=first.search_id,
                                      limits=SearchLimits(max_evaluations=3)))
        assert more.search_id == first.search_id and more.evaluations == 3 and "3 of 3" in more.stop_reason
        assert stored_config(services.store, first.search_id).max_evaluations == 3
        notes = services.store.list_notes(task_id=NORM, limit=50)

        # Resumed again with no limit: the stored one holds, nothing is judged again, no note is added.
        again = asyncio.run(run_search(NORM, config, services=services, search_id=first.search_id))
        assert again.evaluations == 3
        after = services.store.list_notes(task_id=NORM, limit=50)
        assert [n.id for n in after] == [n.id for n in notes]
        texts = [n.text for n in after]
        assert len(texts) == len(set(texts))
        # The note's per-strategy figures are the ranked readings with their intervals, not raw maxima.
        assert all("up to" not in t for t in texts) and any("best" in t and "x" in t for t in texts)

        # A search resumes only as the search of its own task.
        with pytest.raises(RecordNotFoundError, match="is a search of 12p_RMSNorm"):
            asyncio.run(run_search("41k_Gemm_Add_ReLU", config, services=services, search_id=first.search_id))
    finally:
        services.store.close()
        services.memory.close()
