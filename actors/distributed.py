"""A session over AutoGen's gRPC runtime: actors live in worker processes (``python -m actors.worker``),
possibly on other machines; this side connects as one more worker, starts the session and waits for it."""

from __future__ import annotations

import asyncio

from maxkernel.messages import Budget, OptimizeRequest, SessionFinished, new_id
from maxkernel.runtime import PLANNER, SessionWaiter, connect_worker, publish


async def run_remote_session(host: str, task_id: str, *, store_url: str, brain: str = "rules", target: str = "cpu",
                             size: str = "cpu", budget: Budget | None = None, session_id: str | None = None,
                             timeout_s: float | None = None) -> SessionFinished:
    """Start one session on the actors served through ``host`` and return how it finished."""
    from jaxbench.task import load_task
    from memory import Store

    budget = budget or Budget()
    session_id = session_id or new_id()
    task = load_task(task_id)
    store = Store.open(store_url)
    runtime = await connect_worker(host)
    finished: SessionFinished | None = None
    try:
        store.create_session(mode="auto", brain=brain, target=target, budget=budget.model_dump(), task_id=task.id,
                             id=session_id)
        waiter = SessionWaiter()
        await waiter.register(runtime, agent_type=f"session_waiter_{session_id}")
        await publish(runtime, OptimizeRequest(session_id=session_id, task_id=task.id, target=target, size=size,
                                               brain=brain, budget=budget, sender="session"), PLANNER)
        try:
            finished = await waiter.wait(session_id, timeout_s)
        except asyncio.TimeoutError:
            finished = SessionFinished(session_id=session_id, task_id=task.id, status="error",
                                       reason=f"session timed out after {timeout_s} s")
        return finished
    finally:
        store.set_session_status(session_id, finished.status if finished else "error")
        store.close()
        await runtime.stop()
