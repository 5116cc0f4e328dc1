"""How a process builds its actors: which brain each role gets, which model, where data lives.

It is plain data so that a gRPC worker on another machine is configured with the same JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BrainKind = Literal["rules", "llm"]
BRAIN_ROLES = ("planner", "coder", "debugger", "profiler", "tuner")


class ActorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    brain: BrainKind = "rules"
    brains: dict[str, BrainKind] = Field(default_factory=dict, description="per-role override of `brain`")
    model: str = Field("replay", description="preset in config/models.yaml for LLM brains")
    models: dict[str, str] = Field(default_factory=dict, description="per-role override of `model`")
    base_url: str | None = Field(None, description="overrides the preset's base_url")
    transcript: Path | None = Field(None, description="replay: the transcript the replies come from")
    record_to: Path | None = Field(None, description="save every real model exchange to this JSONL file")
    retry_base_delay_s: float = 1.0
    store_url: str | None = Field(None, description="SQL store; default: the settings' store")
    data_dir: str | None = None
    eval_timing_rounds: int | None = None
    eval_correctness_seeds: int | None = None
    eval_timeout_s: float | None = None
    edge_cases: list[str] = Field(default_factory=list,
                                  description="extra inputs the tester judges passing drafts on: negated, scaled_up")
    max_restarts: int = Field(1, description="restarts of a crashed actor (per role and session) before its message is reported")
    max_reprompts: int = Field(2, description="times a reply without usable code is sent back")
    max_tool_iterations: int = 4
    remember: bool = Field(True, description="the librarian stores verified kernels and notes")

    @classmethod
    def from_file(cls, path: Path) -> "ActorConfig":
        """Read a YAML or JSON file (JSON is YAML); relative paths in it stay relative to the caller."""
        import yaml

        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    def brain_for(self, role: str) -> BrainKind:
        return self.brains.get(role, self.brain)

    def model_for(self, role: str) -> str:
        return self.models.get(role, self.model)
