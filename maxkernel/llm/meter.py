"""Token and money accounting per actor and session, and the budget gate in front of every model call.

The ledger that counts is the store's: every process books its calls there, so a budget holds across
the fleet however many workers a session's actors run on."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Protocol, Sequence

from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage

from maxkernel.llm.delegate import DelegatingClient
from maxkernel.llm.errors import BudgetExceeded
from maxkernel.llm.presets import Price


@dataclass
class UsageRecord:
    actor: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    session_tokens: int
    session_cost_usd: float


class SharedBook(Protocol):
    """The store's ledger (``memory.Store``): every process books there, budgets are checked there."""

    def book(self, scope: str, *, tokens_in: int, tokens_out: int, cost_usd: float, model: str = "",
             process: str = "") -> Any: ...

    def spent(self, scope: str) -> Any: ...


def process_name() -> str:
    return f"{socket.gethostname()[:30]}:{os.getpid()}"


@dataclass
class Ledger:
    """What one session has spent. ``pending`` holds records not yet published on the bus.

    With ``shared`` (the store) every call is also booked there under ``scope``, and the budget is
    checked against what all processes booked to that scope, so actors on many workers share it."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    by_actor: dict[str, dict[str, float]] = field(default_factory=dict)
    pending: list[UsageRecord] = field(default_factory=list)
    shared: SharedBook | None = None
    scope: str = ""

    def _totals(self) -> tuple[int, float]:
        """This scope's spending: the fleet's when shared, else this process's."""
        if self.shared is None:
            return self.tokens, self.cost_usd
        spend = self.shared.spent(self.scope)
        return max(self.tokens, spend.tokens), max(self.cost_usd, spend.cost_usd)

    def exhausted(self) -> str | None:
        """Why no further call may be made, or None."""
        if self.max_tokens is None and self.max_cost_usd is None:
            return None
        tokens, cost = self._totals()
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"token budget spent: {tokens} of {self.max_tokens} tokens"
        if self.max_cost_usd is not None and cost >= self.max_cost_usd:
            return f"money budget spent: ${cost:.4f} of ${self.max_cost_usd:.4f}"
        return None

    def check(self) -> None:
        reason = self.exhausted()
        if reason:
            raise BudgetExceeded(reason)

    def add(self, actor: str, model: str, prompt: int, completion: int, price: Price) -> UsageRecord:
        cost = price.cost(prompt, completion)
        self.tokens += prompt + completion
        self.cost_usd += cost
        mine = self.by_actor.setdefault(actor, {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0})
        mine["prompt_tokens"] += prompt
        mine["completion_tokens"] += completion
        mine["cost_usd"] += cost
        if self.shared is not None:
            self.shared.book(self.scope, tokens_in=prompt, tokens_out=completion, cost_usd=cost, model=model,
                             process=f"{process_name()}/{actor}")
        record = UsageRecord(actor, model, prompt, completion, cost, self.tokens, self.cost_usd)
        self.pending.append(record)
        return record

    def drain(self, actor: str | None = None) -> list[UsageRecord]:
        """Take the unpublished records (of one actor, or all)."""
        taken = [r for r in self.pending if actor is None or r.actor == actor]
        self.pending = [r for r in self.pending if not (actor is None or r.actor == actor)]
        return taken


class MeteredClient(DelegatingClient):
    """Refuses a call once the budget is spent; books every reply's usage to the actor."""

    def __init__(self, inner: ChatCompletionClient, ledger: Ledger, actor: str, model: str, price: Price) -> None:
        super().__init__(inner)
        self.ledger, self.actor, self.model, self.price = ledger, actor, model, price

    def _book(self, result: CreateResult) -> None:
        self.ledger.add(self.actor, self.model, result.usage.prompt_tokens, result.usage.completion_tokens, self.price)

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:  # type: ignore[override]
        self.ledger.check()
        result = await self.inner.create(messages, **kwargs)
        self._book(result)
        return result

    async def create_stream(self, messages: Sequence[LLMMessage], **kwargs: Any) -> AsyncGenerator[Any, None]:  # type: ignore[override]
        self.ledger.check()
        async for chunk in self.inner.create_stream(messages, **kwargs):
            if isinstance(chunk, CreateResult):
                self._book(chunk)
            yield chunk
