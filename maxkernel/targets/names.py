"""Target names: the one place that says which ``--target`` values exist and what they mean."""

from __future__ import annotations

from typing import Literal

TargetKind = Literal["cpu", "gpu", "tpu"]

GENERATIONS: tuple[str, ...] = ("v4", "v5e", "v5p", "v6e", "v7")
GPU_CHIPS: tuple[str, ...] = ("a100", "h100", "h200", "b200")
TARGETS: tuple[str, ...] = ("cpu", "gpu", *(f"gpu-{c}" for c in GPU_CHIPS), *(f"tpu-{g}" for g in GENERATIONS))


class TargetError(ValueError):
    """A target name, target spec or candidate that the target machinery cannot use (one-line message)."""


def parse_target(name: str) -> tuple[TargetKind, str | None]:
    """``"tpu-v5e"`` -> ``("tpu", "v5e")``; ``"gpu-h100"`` -> ``("gpu", "h100")``; ``"cpu"`` -> ``("cpu", None)``;
    bare ``"gpu"`` -> ``("gpu", None)`` (the GPU this machine has: see :func:`resolve_gpu`); anything else is a
    TargetError."""
    key = name.strip().lower()
    if key in ("cpu", "gpu"):
        return key, None  # type: ignore[return-value]
    if key.startswith("gpu-") and key[4:] in GPU_CHIPS:
        return "gpu", key[4:]
    if key.startswith("tpu-") and key[4:] in GENERATIONS:
        return "tpu", key[4:]
    raise TargetError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)}")


def tpu_generation(name: str) -> str:
    """A TPU generation given as ``"v5e"`` or ``"tpu-v5e"``, checked against :data:`GENERATIONS`."""
    key = name.strip().lower()
    key = key[4:] if key.startswith("tpu-") else key
    if key not in GENERATIONS:
        raise TargetError(f"unknown TPU generation {name!r}: expected one of {', '.join(GENERATIONS)}")
    return key


def gpu_chip(name: str) -> str:
    """A GPU chip given as ``"h100"`` or ``"gpu-h100"``, checked against :data:`GPU_CHIPS`."""
    key = name.strip().lower()
    key = key[4:] if key.startswith("gpu-") else key
    if key not in GPU_CHIPS:
        raise TargetError(f"unknown GPU {name!r}: expected one of {', '.join(GPU_CHIPS)}")
    return key


def chip_of_device_kind(device_kind: str) -> str | None:
    """The chip a CUDA ``device_kind`` (e.g. ``"NVIDIA H100 80GB HBM3"``) names, or None if it is none of ours."""
    words = device_kind.lower().replace("-", " ").split()
    return next((chip for chip in GPU_CHIPS if chip in words), None)


def resolve_gpu(target: str) -> str:
    """The chip of a GPU target: its own for ``gpu-<chip>``; for bare ``gpu`` the GPU this machine has, refused
    with one line where there is none (or it is not one the targets file describes)."""
    kind, chip = parse_target(target)
    if kind != "gpu":
        raise TargetError(f"{target!r} is not a GPU target")
    if chip is not None:
        return chip
    import jax

    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        raise TargetError("--target gpu means the GPU this machine has, and it has none: name one of "
                          + ", ".join(f"gpu-{c}" for c in GPU_CHIPS))
    found = chip_of_device_kind(devices[0].device_kind)
    if found is None:
        raise TargetError(f"this machine's GPU {devices[0].device_kind!r} is none of "
                          f"{', '.join(GPU_CHIPS)}: name the closest as --target gpu-<chip>")
    return found
