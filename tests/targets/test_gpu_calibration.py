"""The GPU cost model against Triton's fused-attention tutorial (published TFLOP/s; see gpu_calibration)."""

from __future__ import annotations

import pytest

from maxkernel.targets.gpu_calibration import FIT_AT, PUBLISHED_TFLOPS, fitted_dot_efficiency, modelled_tflops
from maxkernel.targets.gpu_spec import load_gpu_constants


def test_config_holds_the_fitted_dot_efficiency() -> None:
    now = load_gpu_constants().dot_efficiency.value
    assert fitted_dot_efficiency(now) == pytest.approx(now, rel=0.02)


@pytest.mark.parametrize("seq", [s for s in PUBLISHED_TFLOPS if s != FIT_AT and s <= 4096])
def test_other_lengths_within_a_fifth_of_the_published_figures(seq: int) -> None:
    assert modelled_tflops(seq) == pytest.approx(PUBLISHED_TFLOPS[seq], rel=0.2)
