"""The selective state-space recurrence written as a step-by-step ``lax.scan`` (with a convolution-free
prologue of its own: softplus of the step sizes, the decay as ``exp(dt * A)``, B and C sliced from one packed
input), written for these tests: ``tpu_ssd`` runs the reference's code before and after the scan in XLA and
the chunked kernel in place of the scan, in TPU interpret mode, against the reference. Near misses (a state
squashed by a tanh each step; a state that starts at one) are refused with their reasons."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxbench.static_checks import scan
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.templates.ssd_scan import reading
from maxkernel.templates.tpu_ssd import TPU_SSD
from support import task_folder, task_yaml

SCANNED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, heads, head_dim, state):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    x = jax.random.normal(k1, (batch, seq, heads, head_dim), jnp.float32)
    packed = jax.random.normal(k2, (batch, seq, 2 * state), jnp.float32)
    raw_dt = jax.random.normal(k3, (batch, seq, heads), jnp.float32) - 2.0
    a_log = jax.random.uniform(k4, (heads,), jnp.float32, -1.0, 1.0)
    return (packed, raw_dt, x, a_log), {}


def reference(packed, raw_dt, x, a_log):
    n = packed.shape[-1] // 2
    bs, cs = packed[..., :n], packed[..., n:]
    dt = jax.nn.softplus(raw_dt)
    decay = jnp.exp(dt * -jnp.exp(a_log))

    def step(h, inputs):
        xt, bt, ct, dtt, dect = inputs
        h = dect[:, :, None, None] * h + (dtt[:, :, None] * xt)[..., None] * bt[:, None, None, :]
        return h, jnp.einsum("bhpn,bn->bhp", h, ct, precision=jax.lax.Precision.HIGHEST)

    batch, _, heads, head_dim = x.shape
    h0 = jnp.zeros((batch, heads, head_dim, n), jnp.float32)
    moved = [jnp.moveaxis(t, 1, 0) for t in (x, bs, cs, dt, decay)]
    _, ys = jax.lax.scan(step, h0, moved)
    return jnp.moveaxis(ys, 0, 1) * 2.0
'''

NEAR_MISSES = {
    "a squashed state": (SCANNED.replace("h = dect[:, :, None, None] * h +", "h = jnp.tanh(dect[:, :, None, None] * h) +"),
                         "not the selective state-space recurrence"),
    "a state starting at one": (SCANNED.replace("jnp.zeros((batch, heads, head_dim, n)", "jnp.ones((batch, heads, head_dim, n)"),
                                "not the selective state-space recurrence"),
}

SIZES = {"cpu": {"batch": 2, "seq": 256, "heads": 8, "head_dim": 16, "state": 16},
         "full": {"batch": 2, "seq": 4096, "heads": 32, "head_dim": 64, "state": 64}}


def _task(tmp_path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "recurrence", 1e-3, SIZES["cpu"], SIZES["full"], "seq"), source)


def test_a_scanned_recurrence_runs_as_the_chunked_kernel_in_tpu_interpret_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "scanned", SCANNED)
    assert TPU_SSD.applies(task, analyze_task(task)) is None
    source = TPU_SSD.render(task, {"chunk": 64, "block_h": 8, "passes": 6}, ("cpu",))
    assert "def _before(packed, raw_dt, x, a_log):" in source and "def _after(" in source
    assert "jnp.log(" not in source  # the decay's own exponent is summed, not the log of the decay
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    args, static = task.module.get_inputs(jax.random.PRNGKey(2), **SIZES["cpu"])
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(namespace["kernel"])(*args, **static))
    np.testing.assert_allclose(got, np.asarray(task.reference(*args, **static)), rtol=1e-3, atol=1e-3)
    strategies = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:tpu_ssd" in strategies


def test_code_every_size_shares_is_written_once_and_passes_the_static_checks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The packed input's split follows its width: one function before the scan serves both sizes (no
    dispatch by shape), and the candidate passes the evaluator's static checks."""
    task = _task(tmp_path, "scanned", SCANNED)
    source = TPU_SSD.render(task, {"chunk": 64, "block_h": 8, "passes": 6}, ("cpu", "full"))
    assert "def _stages(shapes):" not in source and source.count("def _before(") == 1
    findings, _ = scan(source)
    assert findings == [], [str(f) for f in findings]


def test_the_scan_is_read_at_the_check_ladders_sizes_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Code around the scan written per size (a region's literal slices) must also serve the sizes a check is
    looked for at, or no size below ``full`` (for the region, or a layer spliced from it) runs what is priced:
    the scan is read at each rung of the first size parameter that shrinks (``seq``: the batch is 2 at both)."""
    from maxkernel.templates.tpu_ssd import _ladder_cuts, analyse

    task = _task(tmp_path, "scanned", SCANNED)
    first = analyse(task, "full")
    assert not isinstance(first, str)
    cuts, integers = _ladder_cuts(task, first)
    assert {"seq_2048", "seq_1024", "seq_512", "seq_256"} <= set(cuts) and all(name.startswith("seq_") for name in cuts)
    assert set(integers) == set(cuts)  # each rung's integer statics, for the one function around the scan
    for name, found in cuts.items():  # each rung's own cut, its packed input [batch, seq, 2 state] at full width
        assert found.cut is not None and found.cut.around.before.inputs[0].shape == (2, int(name.removeprefix("seq_")), 128)


def test_the_roles_come_from_the_probe(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """B and C have one shape, dt and the decay another: the probe tells which is which (x, dt, the decay,
    B, C among the scan's operands x, B, C, dt, decay)."""
    assert reading(_task(tmp_path, "scanned", SCANNED)) == (0, 3, 4, 1, 2)


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_refused_with_their_reason(tmp_path, name) -> None:  # type: ignore[no-untyped-def]
    source, reason = NEAR_MISSES[name]
    task = _task(tmp_path, name.replace(" ", "_"), source)
    found = TPU_SSD.applies(task, analyze_task(task))
    assert found is not None and reason in found, found
