"""Shared helpers for the linops tests."""

import numpy as np


def assert_close(actual, expected, *, rtol=1e-7, atol=1e-9, err_msg=""):
    """Relative comparison scaled by the reference's magnitude (float64 algebra tests)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale, err_msg=err_msg)
