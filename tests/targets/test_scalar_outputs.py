"""Tasks whose reference returns (or takes) a 0-d array: the reference, judged as a candidate, is ``ok``.

A loss task returns per-token losses and their mean, a shape-() array; every array crosses the pipe to and
from the candidate's worker, so a 0-d array must arrive 0-d on both sides.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from target_kernels import write_task

from jaxbench.task import Task, load_task
from maxkernel.evaluation import evaluate_candidate

SCALAR_LOSS_TASK = {
    "task.yaml": """\
id: tgt_scalar_loss
name: Scalar_Loss
category: reduction
description: >
  Tempered per-token cross-entropy and its float32 mean; the temperature is a 0-d array input.
dtype: float32
tolerance: {atol: 1.0e-4, rtol: 1.0e-4}
sizes:
  cpu: {tokens: 64, vocab: 256}
  full: {tokens: 1024, vocab: 2048}
free: {tokens: {}}
""",
    "reference.py": '''\
"""Tempered per-token cross-entropy and its mean."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, vocab):
    k1, k2, k3 = jax.random.split(key, 3)
    logits = jax.random.normal(k1, (tokens, vocab), jnp.float32)
    labels = jax.random.randint(k2, (tokens,), 0, vocab, dtype=jnp.int32)
    temperature = jax.random.uniform(k3, (), jnp.float32, 0.5, 2.0)
    return (logits, labels, temperature), {}


def reference(logits, labels, temperature):
    z = logits / temperature
    nll = jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, labels[:, None], axis=-1)[:, 0]
    return nll, jnp.mean(nll)
''',
}


@pytest.fixture(scope="module")
def scalar_loss_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return load_task(write_task(tmp_path_factory.mktemp("tasks") / "tgt_scalar_loss", SCALAR_LOSS_TASK))


def _reference_as_candidate(task: Task) -> str:
    return Path(task.reference_path).read_text() + "\n\ndef kernel(*args, **statics):\n    return reference(*args, **statics)\n"


@pytest.mark.parametrize("target", ["tpu-v6e", "cpu"])
def test_reference_with_a_scalar_output_is_ok(quick_evaluator, scalar_loss_task: Task, target: str) -> None:
    report = evaluate_candidate(scalar_loss_task, _reference_as_candidate(scalar_loss_task), target=target,
                                evaluator=quick_evaluator)
    assert report.status == "ok", report.reason
    assert report.label == "reference-equivalent"
    assert [c.name for c in report.checks if c.name.startswith("correct_") and c.passed]


def test_a_scalar_output_of_the_wrong_shape_is_still_refused(quick_evaluator, scalar_loss_task: Task) -> None:
    """The shape check stands: a candidate that returns the mean as shape (1,) is incorrect."""
    source = Path(scalar_loss_task.reference_path).read_text() + (
        "\n\ndef kernel(*args, **statics):\n"
        "    nll, mean = reference(*args, **statics)\n"
        "    return nll, mean.reshape(1)\n")
    report = evaluate_candidate(scalar_loss_task, source, target="tpu-v6e", evaluator=quick_evaluator)
    assert report.status == "incorrect"
    assert "has shape (1,), expected ()" in report.reason
