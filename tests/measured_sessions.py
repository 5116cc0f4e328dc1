"""Sessions written into a real store the way the recorder writes them: a plan, judged drafts (and a tool
report that must not count), and tuning reports with their trials."""

from __future__ import annotations

from typing import Any

from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import EvalReport, FixRequest, KernelDraft, Plan, StrategyRef, TuneReport, TuneTrial, new_id
from memory import Store

Result = tuple[str, float | None]  # (status, speedup)


def report(task_id: str, status: str, speedup: float | None, target: str = "cpu",
           label: str = "pallas-kernel") -> JudgeReport:
    ok = status == "ok"
    return JudgeReport(task=task_id, target=target, status=status, correct=ok, speedup=speedup if ok else None,
                       reason="" if ok else f"{status}: block does not divide the array", label=label if ok else None)


def record_session(store: Store, task_id: str, strategies: list[StrategyRef], drafts: dict[str, Result],
                   tuned: dict[str, list[tuple[dict[str, Any], str, float | None]]] | None = None,
                   target: str = "cpu") -> str:
    """One session on ``task_id``: ``drafts`` maps a strategy name to its draft's result, ``tuned`` to
    its tuning trials (params, status, speedup). Returns the session id."""
    session = new_id()
    plan = Plan(session_id=session, task_id=task_id, target=target, strategies=strategies)
    store.append_event(plan, session_id=session, task_id=task_id)
    names = [s.name for s in strategies]
    for name, (status, speedup) in drafts.items():
        step_plan = plan.model_copy(update={"step": names.index(name)})
        draft = KernelDraft(session_id=session, task_id=task_id, candidate_id=new_id(), plan=step_plan,
                            source=f"# {name}", produced_by="coder")
        judged = report(task_id, status, speedup, target)
        kind = EvalReport if status == "ok" else FixRequest
        store.append_event(kind(session_id=session, task_id=task_id, draft=draft, report=judged),
                           session_id=session, task_id=task_id)
        for params, trial_status, trial_speedup in (tuned or {}).get(name, []):
            tool = KernelDraft(session_id=session, task_id=task_id, candidate_id=new_id(), plan=step_plan,
                               source=f"# {name} {params}", produced_by="tuner:tool")
            store.append_event(EvalReport(session_id=session, task_id=task_id, draft=tool,
                                          report=report(task_id, trial_status, trial_speedup, target)),
                               session_id=session, task_id=task_id)
        if name in (tuned or {}):
            trials = [TuneTrial(params=p, status=s, speedup=x) for p, s, x in tuned[name]]  # type: ignore[index]
            store.append_event(TuneReport(session_id=session, task_id=task_id, strategy=name, trials=trials,
                                          best_source=f"# {name}", best_report=judged),
                               session_id=session, task_id=task_id)
    return session
