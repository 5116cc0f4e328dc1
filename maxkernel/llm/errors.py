"""Errors a model client raises that the actors turn into one clear line or a clean stop."""

from __future__ import annotations


class LlmError(Exception):
    """Base of the model-client errors below."""


class MissingApiKeyError(LlmError):
    """A provider needs a key that is not set; the message is the one line the user sees."""

    def __init__(self, provider: str, variables: tuple[str, ...]) -> None:
        names = " or ".join(variables)
        super().__init__(f"{provider}: no API key: set {names}, or run with --brain rules (needs no model)")
        self.provider = provider
        self.variables = variables


class BudgetExceeded(LlmError):
    """The session spent its token or money budget; no further model call is made."""


class UnknownPresetError(LlmError):
    """A model preset or provider that config/models.yaml does not define."""


class TranscriptError(LlmError):
    """A replay transcript that is missing, malformed, or has no reply left for an actor."""
