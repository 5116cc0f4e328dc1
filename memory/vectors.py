"""The vector half of the memory: two Chroma collections, ``kernels`` and ``notes``.

Chroma holds only what recall needs to rank and filter: the vector, and a few metadata fields (task,
target, speedup, strategy, category). Full records (code, reports) live in the SQL store under the
same ids. Embedded (``PersistentClient`` in the data dir) by default; a Chroma server
(``HttpClient``) when ``chroma_url`` is set.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import structlog
from pydantic import BaseModel

from memory.errors import MemoryStoreError, VectorStoreError

log = structlog.get_logger(__name__)

KERNELS = "kernels"
NOTES = "notes"
COLLECTIONS = (KERNELS, NOTES)
Scalar = str | int | float | bool


WRITER = "writer"  # metadata key: the process that stored the vector (see ``writer_name``)


def writer_name() -> str:
    """This process as a vector's writer, ``host:pid``: a vector whose writer died before its record
    committed can then be found and forgotten (``Memory.forget_unrecorded``)."""
    return f"{socket.gethostname()[:30]}:{os.getpid()}"


class VectorHit(BaseModel):
    id: str
    score: float
    metadata: dict[str, Scalar]


def _server_address(url: str) -> tuple[str, int, bool]:
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise VectorStoreError(f"invalid chroma_url {url!r}: expected http://host:port")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 8000)
    except ValueError as exc:
        raise VectorStoreError(f"invalid chroma_url {url!r}: {exc}") from exc
    return parsed.hostname, port, parsed.scheme == "https"


def _clean(metadata: Mapping[str, Any]) -> dict[str, Scalar]:
    """Chroma refuses ``None`` values and anything but scalars."""
    return {k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool))}


class VectorMemory:
    """Chroma collections tagged with the embedding that filled them."""

    def __init__(self, client: Any, where: str, embedding: str, dim: int, *, check_embedding: bool = True) -> None:
        self._client = client
        self.where = where
        self.embedding = embedding
        self.dim = dim
        self._check = check_embedding
        self._collections: dict[str, Any] = {}
        with self._guard("opening the collections"):
            for name in COLLECTIONS:
                self._collections[name] = self._open_collection(name)

    @classmethod
    def open(
        cls, *, url: str = "", path: Path | None = None, embedding: str, dim: int, check_embedding: bool = True
    ) -> VectorMemory:
        """A Chroma server if ``url`` is set, else an embedded store at ``path``.

        ``check_embedding=False`` accepts collections filled by another embedding: only for
        ``rebuild``, which replaces them.
        """
        import chromadb

        chroma_settings = chromadb.Settings(anonymized_telemetry=False)
        if url:
            host, port, ssl = _server_address(url)
            where = f"{'https' if ssl else 'http'}://{host}:{port}"
            try:
                client = chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=chroma_settings)
                client.heartbeat()
            except Exception as exc:
                raise VectorStoreError(f"cannot reach the Chroma server at {where}: {exc}") from exc
        else:
            if path is None:
                raise VectorStoreError("no chroma_url and no chroma path: nowhere to keep vectors")
            where = str(path)
            try:
                path.mkdir(parents=True, exist_ok=True)
                client = chromadb.PersistentClient(path=str(path), settings=chroma_settings)
            except Exception as exc:
                raise VectorStoreError(
                    f"cannot open the embedded Chroma store at {where}: {type(exc).__name__}: {exc}"
                ) from exc
        return cls(client, where, embedding, dim, check_embedding=check_embedding)

    @contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Any Chroma or transport failure becomes one VectorStoreError naming the store."""
        try:
            yield
        except MemoryStoreError:
            raise
        except Exception as exc:
            raise VectorStoreError(f"Chroma failed while {doing}: {self.where} ({type(exc).__name__}: {exc})") from exc

    def _open_collection(self, name: str) -> Any:
        tag = {"embedding": self.embedding, "dim": self.dim}
        collection = self._client.get_or_create_collection(
            name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}, metadata=tag
        )
        found = collection.metadata or {}
        if found.get("embedding") != self.embedding or found.get("dim") != self.dim:
            if collection.count() == 0:
                collection.modify(metadata=tag)
            elif self._check:
                raise VectorStoreError(
                    f"Chroma collection {name!r} at {self.where} holds vectors of embedding "
                    f"{found.get('embedding')!r} (dim {found.get('dim')}), but the settings ask for "
                    f"{self.embedding!r} (dim {self.dim}); run `maxkernel memory reindex` to rebuild it"
                )
        return collection

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if callable(close):
            close()

    def upsert(
        self,
        collection: str,
        ids: Sequence[str],
        embeddings: Sequence[np.ndarray] | np.ndarray,
        metadatas: Sequence[Mapping[str, Any]],
    ) -> None:
        if not ids:
            return
        with self._guard(f"storing {len(ids)} vector(s) in {collection!r}"):
            self._collections[collection].upsert(
                ids=list(ids),
                embeddings=np.asarray(embeddings, dtype=np.float32),
                metadatas=[_clean(m) for m in metadatas],
            )

    def query(
        self,
        collection: str,
        embedding: np.ndarray,
        k: int,
        where: Mapping[str, Scalar] | None = None,
    ) -> list[VectorHit]:
        """The ``k`` nearest vectors, best first; ``score`` is cosine similarity.

        A ``where`` filter is applied after an unfiltered search over ``4 k`` neighbours when that
        finds enough: Chroma's own filtering first lists every matching id, which grows with the
        collection and dominated latency at 100k kernels. Only a selective filter falls back to it.
        """
        col = self._collections[collection]
        if k <= 0:
            return []
        with self._guard(f"searching {collection!r}"):
            wanted = k * 4 if where else k
            hits = self._search(col, embedding, wanted, None)
            if where:
                exhausted = len(hits) < wanted  # the whole collection was searched
                hits = [h for h in hits if all(h.metadata.get(key) == value for key, value in where.items())]
                if len(hits) < k and not exhausted:
                    hits = self._search(col, embedding, k, dict(where))
        return hits[:k]

    @staticmethod
    def _search(col: Any, embedding: np.ndarray, n: int, where: dict[str, Scalar] | None) -> list[VectorHit]:
        result = col.query(
            query_embeddings=np.asarray([embedding], dtype=np.float32),
            n_results=n,
            where=where if where else None,
            include=["distances", "metadatas"],
        )
        ids = result["ids"][0]
        distances = result["distances"][0]
        metadatas = result["metadatas"][0] if result.get("metadatas") else [{}] * len(ids)
        return [
            VectorHit(id=i, score=float(1.0 - d), metadata=dict(m or {}))
            for i, d, m in zip(ids, distances, metadatas)
        ]

    def ids_where(self, collection: str, where: Mapping[str, Scalar]) -> list[str]:
        """Ids of the vectors whose metadata match ``where``."""
        with self._guard(f"listing {collection!r}"):
            return list(self._collections[collection].get(where=dict(where), include=[])["ids"])

    def count(self, collection: str) -> int:
        with self._guard(f"counting {collection!r}"):
            return int(self._collections[collection].count())

    def delete(self, collection: str, ids: Sequence[str]) -> None:
        if ids:
            with self._guard(f"deleting from {collection!r}"):
                self._collections[collection].delete(ids=list(ids))

    def rebuild(self) -> None:
        """Drop and recreate both collections (before re-embedding everything from SQL)."""
        with self._guard("recreating the collections"):
            for name in COLLECTIONS:
                self._client.delete_collection(name)
                self._collections[name] = self._open_collection(name)
