"""The structural embedding: deterministic, normalized, and close for similar work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxbench import load_task
from maxkernel.analysis.signature import task_signature
from memory.embedding import DIM, StructuralEmbedder, alias_features, make_embedder
from memory.errors import EmbeddingError


@pytest.fixture(scope="module")
def sigs(task_dir):
    return {name: task_signature(load_task(task_dir(name))) for name in ("t_gemm_gelu", "t_gemm_relu", "t_rmsnorm", "t_softmax")}


def test_vectors_are_unit_length_in_a_fixed_dim(sigs) -> None:
    emb = StructuralEmbedder()
    for sig in sigs.values():
        for vec in (emb.embed(sig), emb.embed(sig, "def kernel(x): return x")):
            assert vec.shape == (DIM,) and vec.dtype == np.float32
            assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-5)


def test_the_same_input_gives_the_same_vector_in_another_process(sigs) -> None:
    """Feature hashing must not use Python's per-process randomized hash."""
    sig = sigs["t_gemm_gelu"]
    code = (
        "import json, sys\n"
        "from maxkernel.analysis.signature import TaskSignature\n"
        "from memory.embedding import StructuralEmbedder\n"
        "sig = TaskSignature.model_validate_json(sys.stdin.read())\n"
        "print(json.dumps(StructuralEmbedder().embed(sig, 'pl.pallas_call(body)').tolist()))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], input=sig.model_dump_json(), capture_output=True, text=True, env=env, check=True
    )
    here = StructuralEmbedder().embed(sig, "pl.pallas_call(body)")
    assert np.allclose(np.array(json.loads(out.stdout), dtype=np.float32), here)


def test_matmul_epilogues_are_closer_to_each_other_than_to_other_work(sigs) -> None:
    emb = StructuralEmbedder()
    v = {name: emb.embed(sig) for name, sig in sigs.items()}
    near = float(v["t_gemm_gelu"] @ v["t_gemm_relu"])
    assert near > float(v["t_gemm_gelu"] @ v["t_rmsnorm"]) + 0.2
    assert near > float(v["t_gemm_gelu"] @ v["t_softmax"]) + 0.2


def test_free_text_lands_near_the_structure_it_names(sigs) -> None:
    emb = StructuralEmbedder()
    query = emb.embed(None, "matmul gelu", alias_features("matmul gelu"))
    gelu = emb.embed(sigs["t_gemm_gelu"])
    assert float(query @ gelu) > float(query @ emb.embed(sigs["t_rmsnorm"]))
    assert float(query @ gelu) > float(query @ emb.embed(sigs["t_softmax"]))


def test_make_embedder_names_and_errors() -> None:
    assert make_embedder("structural").name == "structural-v1-256"
    assert make_embedder("structural:64").dim == 64
    with pytest.raises(EmbeddingError, match="unknown embedding 'word2vec'"):
        make_embedder("word2vec")
    with pytest.raises(EmbeddingError, match="needs a model name"):
        make_embedder("sentence-transformers:")


def test_sentence_transformers_missing_package_or_model_is_one_clear_error() -> None:
    with pytest.raises(EmbeddingError, match="sentence-transformers") as info:
        make_embedder("sentence-transformers:no-such-model-anywhere")
    message = str(info.value)
    assert "\n" not in message
    assert "not installed" in message
