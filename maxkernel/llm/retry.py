"""Retry model calls that failed for a passing reason (timeout, rate limit, 5xx) with exponential backoff.

Anything else (a bad request, a refused key) is raised at once: retrying it only burns time.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, AsyncGenerator, Sequence

import structlog
from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage

from maxkernel.llm.delegate import DelegatingClient

log = structlog.get_logger("maxkernel.llm.retry")

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    """A timeout, a rate limit, a 5xx, or a dropped connection, from any of the clients we use."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    if isinstance(status, int) and status in RETRY_STATUS | set(range(500, 600)):
        return True
    try:
        import httpx
        if isinstance(exc, (httpx.TimeoutException, httpx.TransportError)):
            return True
    except ImportError:  # pragma: no cover - httpx comes with both SDKs
        pass
    try:
        import openai
        if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                            openai.InternalServerError)):
            return True
    except ImportError:  # pragma: no cover
        pass
    return False


class RetryingClient(DelegatingClient):
    def __init__(self, inner: ChatCompletionClient, max_retries: int = 4, base_delay_s: float = 1.0,
                 max_delay_s: float = 30.0) -> None:
        super().__init__(inner)
        self.max_retries = max_retries
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.retries = 0

    def _delay(self, attempt: int) -> float:
        return min(self.max_delay_s, self.base_delay_s * 2**attempt) * (0.5 + random.random() / 2)

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:  # type: ignore[override]
        attempt = 0
        while True:
            try:
                return await self.inner.create(messages, **kwargs)
            except Exception as exc:
                if attempt >= self.max_retries or not is_transient(exc):
                    raise
                delay = self._delay(attempt)
                log.warning("llm.retry", attempt=attempt + 1, delay_s=round(delay, 3), error=str(exc)[:200])
                self.retries += 1
                attempt += 1
                await asyncio.sleep(delay)

    async def create_stream(self, messages: Sequence[LLMMessage], **kwargs: Any) -> AsyncGenerator[Any, None]:  # type: ignore[override]
        """Retries only until the first chunk arrives: a stream cut halfway is not replayed silently."""
        attempt = 0
        while True:
            started = False
            try:
                async for chunk in self.inner.create_stream(messages, **kwargs):
                    started = True
                    yield chunk
                return
            except Exception as exc:
                if started or attempt >= self.max_retries or not is_transient(exc):
                    raise
                delay = self._delay(attempt)
                log.warning("llm.retry", attempt=attempt + 1, delay_s=round(delay, 3), error=str(exc)[:200])
                self.retries += 1
                attempt += 1
                await asyncio.sleep(delay)
