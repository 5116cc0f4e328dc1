import numpy as np
import ml_dtypes

from jaxbench.compare import compare_outputs


def test_within_tolerance_passes_and_reports_error():
    e = np.ones((4, 4), np.float32)
    res = compare_outputs(e, e + 1e-6, atol=1e-5, rtol=0)
    assert res.ok and 0 < res.max_abs_err < 2e-6


def test_outside_tolerance_fails_with_count():
    e = np.zeros((10,), np.float32)
    a = e.copy()
    a[3] = 1.0
    res = compare_outputs(e, a, atol=1e-3, rtol=1e-3)
    assert not res.ok and "1 of 10" in res.reason


def test_shape_dtype_and_count_mismatch():
    e = np.zeros((2, 3), np.float32)
    assert "shape" in compare_outputs(e, np.zeros((3, 2), np.float32), 1, 1).reason
    assert "dtype" in compare_outputs(e, np.zeros((2, 3), ml_dtypes.bfloat16), 1, 1).reason
    assert "2 output" in compare_outputs((e, e), (e,), 1, 1).reason


def test_nan_where_reference_is_finite_fails():
    e = np.ones(3, np.float32)
    a = e.copy()
    a[1] = np.nan
    res = compare_outputs(e, a, atol=1e9, rtol=1e9)
    assert not res.ok and "NaN" in res.reason


def test_integer_outputs_must_match_exactly():
    e = np.arange(5, dtype=np.int32)
    assert compare_outputs(e, e.copy(), 0.1, 0).ok
    assert not compare_outputs(e, e + 1, 10.0, 10.0).ok
