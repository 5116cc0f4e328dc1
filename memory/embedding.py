"""Embeddings of kernels, notes and queries.

The default, ``structural``, needs no download and no model: it feature-hashes the task's structural
signature (jaxpr primitive n-grams, shape class, category) and the tokens of the code or note into a
fixed-size vector, L2-normalized. Two matmul-with-epilogue tasks share ``p1:dot_general``,
``p2:dot_general>add`` and ``cat:matmul``, so their vectors are close whatever their names.

``sentence-transformers:<model>`` embeds a text rendering of the same information with a locally
installed model instead.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from functools import lru_cache
from typing import Protocol

import numpy as np

from maxkernel.analysis.signature import ANCHOR_WEIGHT, ANCHORS, TaskSignature
from memory.errors import EmbeddingError

DIM = 256
STRUCTURAL = "structural"
# Weight of the text part (code or note tokens) against the structure part of a document vector.
TEXT_WEIGHT = 0.5

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_STOPWORDS = frozenset(
    "def return import from as if else elif for in while with and or not is none true false "
    "lambda self pass the a an of to on at by it its be this that".split()
)

# Words a person types, mapped to the signature features they stand for: lets a free-text search
# ("matmul gelu epilogue") land among kernels that were embedded from jaxprs.
ALIASES: dict[str, tuple[str, ...]] = {
    "matmul": ("p1:dot_general", "cat:matmul"),
    "gemm": ("p1:dot_general", "cat:matmul"),
    "linear": ("p1:dot_general",),
    "dot": ("p1:dot_general",),
    "einsum": ("p1:dot_general",),
    "bmm": ("p1:dot_general",),
    "gelu": ("p1:erfc", "p1:erf", "p1:tanh", "fn:gelu"),
    "relu": ("p1:max", "fn:relu"),
    "silu": ("p1:logistic", "fn:silu"),
    "swish": ("p1:logistic", "fn:silu"),
    "sigmoid": ("p1:logistic",),
    "tanh": ("p1:tanh",),
    "softmax": ("p1:exp", "p1:reduce_max", "p1:reduce_sum", "p2:reduce_max>sub", "p2:sub>exp"),
    "logsumexp": ("p1:exp", "p1:log", "p1:reduce_max", "p1:reduce_sum"),
    "norm": ("p1:rsqrt", "p1:reduce_sum", "cat:normalization"),
    "rmsnorm": ("p1:rsqrt", "p1:square", "p1:reduce_sum", "cat:normalization"),
    "layernorm": ("p1:rsqrt", "p1:reduce_sum", "p1:sub", "cat:normalization"),
    "attention": ("cat:attention", "p1:dot_general", "p1:exp", "p1:reduce_max"),
    "conv": ("p1:conv_general_dilated", "cat:conv"),
    "convolution": ("p1:conv_general_dilated", "cat:conv"),
    "moe": ("cat:moe", "p1:ragged_dot_general", "p1:top_k"),
    "scan": ("p1:scan", "cat:recurrence"),
    "reduction": ("cat:reduction", "p1:reduce_sum"),
    "gather": ("p1:gather", "cat:gather"),
    "cumsum": ("p1:cumsum",),
}


def tokens(text: str) -> list[str]:
    """Lower-cased identifiers of code or prose; dotted names also yield their last part."""
    out: list[str] = []
    for match in _TOKEN.findall(text):
        word = match.lower()
        if word in _STOPWORDS or len(word) < 2:
            continue
        out.append(word)
        if "." in word:
            out.append(word.rsplit(".", 1)[1])
    return out


def text_features(text: str) -> dict[str, float]:
    """Token unigrams and bigrams, counts damped (1 + log c)."""
    toks = tokens(text)
    counts: Counter[str] = Counter(f"t:{t}" for t in toks)
    counts.update(f"t2:{a}>{b}" for a, b in zip(toks, toks[1:]))
    return {feat: 1.0 + math.log(c) for feat, c in counts.items()}


def alias_features(text: str) -> dict[str, float]:
    """Signature features named by the words of a free-text query or an op pattern.

    A known word ("gelu") maps through ``ALIASES``; any word may also be a primitive or category
    name as it appears in a signature ("dot_general", "normalization"), and consecutive words form
    primitive bigrams ("dot_general>add").
    """
    feats: dict[str, float] = {}
    words = tokens(text.replace("+", " ").replace(">", " "))
    for word in words:
        for feat in ALIASES.get(word, ()):
            feats[feat] = 1.0
        feats.setdefault(f"p1:{word}", 0.5)
        feats.setdefault(f"cat:{word}", 0.5)
    for a, b in zip(words, words[1:]):
        feats.setdefault(f"p2:{a}>{b}", 0.5)
    for feat, weight in list(feats.items()):
        prim = feat.removeprefix("p1:")
        if feat.startswith("p1:") and prim in ANCHORS:
            feats[f"anchor:{prim}"] = ANCHOR_WEIGHT * weight
    return feats


@lru_cache(maxsize=1 << 16)
def _slot(feature: str, dim: int) -> tuple[int, float]:
    """Bucket and sign of a feature: a stable hash (Python's ``hash`` changes between processes)."""
    digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return digest % dim, 1.0 if (digest >> 63) & 1 else -1.0


def hash_features(features: dict[str, float], dim: int = DIM) -> np.ndarray:
    """Signed feature hashing into ``dim`` floats, L2-normalized (all zeros stays zeros)."""
    if not features:
        return np.zeros(dim, dtype=np.float32)
    slots = [_slot(feature, dim) for feature in features]
    index = np.fromiter((i for i, _ in slots), dtype=np.intp, count=len(slots))
    signed = np.fromiter((s * w for (_, s), w in zip(slots, features.values())), dtype=np.float64, count=len(slots))
    vec = np.bincount(index, weights=signed, minlength=dim).astype(np.float32)
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


def _combine(structure: np.ndarray | None, text: np.ndarray | None, dim: int) -> np.ndarray:
    vec = np.zeros(dim, dtype=np.float32)
    if structure is not None:
        vec += structure
    if text is not None:
        vec += (TEXT_WEIGHT if structure is not None else 1.0) * text
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


class Embedder(Protocol):
    """Turns (structure, text) into a unit vector; ``name`` is stored with the collections."""

    name: str
    dim: int

    def embed(self, signature: TaskSignature | None, text: str = "", extra: dict[str, float] | None = None) -> np.ndarray:
        ...


class StructuralEmbedder:
    """Feature hashing of the signature and the text: deterministic, offline, fast."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.name = f"{STRUCTURAL}-v1-{dim}"
        self._structures: dict[tuple[object, ...], tuple[dict[str, float], np.ndarray]] = {}

    def _structure(self, signature: TaskSignature) -> tuple[dict[str, float], np.ndarray]:
        """Features and hashed vector of a signature, memoized: a bulk load embeds thousands of
        kernels of the same few tasks."""
        key = (
            signature.task_id,
            signature.category,
            signature.shape_class,
            tuple(signature.primitives),
            tuple(signature.calls),
            tuple(o.dtype for o in signature.outputs[:1]),
        )
        found = self._structures.get(key)
        if found is None:
            if len(self._structures) > 4096:
                self._structures.clear()
            feats = signature.features()
            found = self._structures[key] = (feats, hash_features(feats, self.dim))
        return found

    def embed(self, signature: TaskSignature | None, text: str = "", extra: dict[str, float] | None = None) -> np.ndarray:
        """``extra`` adds structure features (a note's op pattern, a query's aliases)."""
        structure: np.ndarray | None = None
        if signature is not None and not extra:
            structure = self._structure(signature)[1]
        else:
            feats = dict(self._structure(signature)[0]) if signature is not None else {}
            for feat, weight in (extra or {}).items():
                feats[feat] = max(feats.get(feat, 0.0), weight)
            structure = hash_features(feats, self.dim) if feats else None
        if structure is not None and not structure.any():
            structure = None
        text_vec = hash_features(text_features(text), self.dim) if text.strip() else None
        return _combine(structure, text_vec, self.dim)


def render(signature: TaskSignature | None, text: str = "", extra: dict[str, float] | None = None) -> str:
    """A text rendering of structure and text, for text-only embedding models."""
    parts: list[str] = []
    if signature is not None:
        parts.append(f"category {signature.category or 'unknown'}; ops {signature.pattern.replace('>', ' ')}")
        parts.append(f"shapes {signature.shape_class}; calls {' '.join(sorted(set(signature.calls)))}")
    if extra:
        parts.append(" ".join(f.split(":", 1)[1].replace(">", " ") for f in extra))
    if text.strip():
        parts.append(text)
    return "\n".join(parts)


class SentenceTransformerEmbedder:
    """A locally installed sentence-transformers model; never downloads."""

    def __init__(self, model: str) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbeddingError(
                f"embedding 'sentence-transformers:{model}' needs the sentence-transformers package, which is "
                "not installed (pip install sentence-transformers, or set embedding: structural)"
            ) from exc
        try:
            self._model = SentenceTransformer(model, local_files_only=True)
        except Exception as exc:
            raise EmbeddingError(
                f"sentence-transformers model {model!r} is not installed locally "
                f"({type(exc).__name__}: {exc}); download it first or set embedding: structural"
            ) from exc
        self.dim = int(self._model.get_sentence_embedding_dimension() or 0)
        self.name = f"sentence-transformers:{model}"

    def embed(self, signature: TaskSignature | None, text: str = "", extra: dict[str, float] | None = None) -> np.ndarray:
        vec = self._model.encode(render(signature, text, extra), normalize_embeddings=True)
        return np.asarray(vec, dtype=np.float32)


def make_embedder(spec: str) -> Embedder:
    """The embedder named in settings: ``structural`` or ``sentence-transformers:<model>``."""
    spec = spec.strip()
    if spec == STRUCTURAL or spec.startswith(f"{STRUCTURAL}:"):
        dim = spec.partition(":")[2]
        if dim and not dim.isdigit():
            raise EmbeddingError(f"embedding {spec!r}: the dimension after 'structural:' must be an integer")
        return StructuralEmbedder(int(dim) if dim else DIM)
    kind, _, model = spec.partition(":")
    if kind == "sentence-transformers":
        if not model:
            raise EmbeddingError("embedding 'sentence-transformers:' needs a model name after the colon")
        return SentenceTransformerEmbedder(model)
    raise EmbeddingError(
        f"unknown embedding {spec!r} (settings key 'embedding'): use 'structural' or 'sentence-transformers:<model>'"
    )
