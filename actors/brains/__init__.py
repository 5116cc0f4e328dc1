"""Brains: what an actor thinks with. ``rules`` needs no model; ``llm`` prompts a chat model."""

from actors.brains.base import Brain, Diagnosis, PlanOutcome, Tools, TuneOutcome, UnusableReply

__all__ = ["Brain", "Diagnosis", "PlanOutcome", "Tools", "TuneOutcome", "UnusableReply", "make_brain"]


def make_brain(kind: str, role: str, services: object, tools: Tools, client: object = None) -> Brain:
    """The brain of ``kind`` for ``role``; imported lazily so that the rules brain never loads model SDKs."""
    if kind == "llm":
        from actors.brains.llm import LlmBrain

        return LlmBrain(role, services, tools, client)  # type: ignore[arg-type]
    from actors.brains.rules import RulesBrain

    return RulesBrain(role, services, tools)  # type: ignore[arg-type]
