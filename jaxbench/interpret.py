"""How Pallas runs on a machine without the target chip, chosen by the evaluator, never by candidates."""

from __future__ import annotations

from typing import Literal

import jax

InterpretMode = Literal["none", "plain", "tpu"]


def force_interpret(mode: InterpretMode) -> None:
    """Make every ``pallas_call`` traced from now on in this process run interpreted.

    ``plain`` is Pallas' HLO interpreter (fast; what ``--target cpu`` times); ``tpu`` simulates TPU
    semantics (VMEM, DMAs, semaphores) and is the faithful check for TPU-targeted kernels.
    """
    from jax._src import config as jax_config
    from jax.experimental.pallas import tpu as pltpu

    if mode == "none":
        jax_config.pallas_tpu_interpret_mode_context_manager.set_global(None)
    elif mode == "plain":
        # Any truthy non-InterpretParams value selects the plain HLO interpreter in pallas_call.
        jax_config.pallas_tpu_interpret_mode_context_manager.set_global(True)
    elif mode == "tpu":
        pltpu.set_tpu_interpret_mode(pltpu.InterpretParams())
    else:
        raise ValueError(f"unknown interpret mode {mode!r}")


def default_mode(target: str) -> InterpretMode:
    """The interpret mode for evaluating a ``target`` candidate on this machine."""
    backend = jax.default_backend()
    if target.startswith("tpu"):
        return "none" if backend == "tpu" else "tpu"
    if target == "gpu":
        return "none" if backend == "gpu" else "plain"
    return "plain" if backend == "cpu" else "none"
