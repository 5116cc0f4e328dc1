"""The analysis' data models (pydantic only, so importing them costs nothing)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

OpKind = Literal["matmul", "conv", "reduction", "normalization", "softmax", "logsumexp", "attention",
                 "elementwise", "scan", "gather", "other"]


class OpNode(BaseModel):
    kind: OpKind
    primitives: list[str]
    shapes: list[list[int]] = Field(description="output shapes")
    prologue: list[str] = Field(default_factory=list, description="ops feeding a matmul's operands")
    epilogue: list[str] = Field(default_factory=list, description="elementwise ops consuming a matmul's product")
    detail: str = ""


class RowLayout(BaseModel):
    rows: int  # product of the output's leading axes
    row_dims: int  # how many leading axes form a row index
    blocked: list[bool]  # per input: shares the row axes
    independent: bool
