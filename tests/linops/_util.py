"""Shared helpers for the linops tests."""

import jax.extend as jex
import numpy as np


def assert_close(actual, expected, *, rtol=1e-7, atol=1e-9, err_msg=""):
    """Relative comparison scaled by the reference's magnitude (float64 algebra tests)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale, err_msg=err_msg)


def equations(jaxpr):
    """Every equation of ``jaxpr`` (a `jax.extend.core.Jaxpr`), those of the programs nested in it included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jex.core.jaxprs_in_params(eqn.params):
            yield from equations(sub)
