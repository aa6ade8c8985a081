"""Slow checks: many more examples, and the algebra in float32 with dtype-scaled tolerances."""

import numpy as np
import pytest
from hypothesis import given, settings

import linops as lo
from linops.testing import assert_adjoint, assert_operators_close, assert_tags_hold
from linops.testing import strategies as lst

pytestmark = pytest.mark.slow


@settings(max_examples=200, deadline=None)
@given(lst.expressions(max_depth=4))
def test_simplify_sound_idempotent_and_no_more_products_deep(case):
    simple = lo.simplify(case.op)
    scale = max(1.0, float(np.abs(case.dense).max()))
    np.testing.assert_allclose(np.asarray(simple.as_matrix()), case.dense, rtol=1e-7, atol=1e-7 * scale)
    assert lo.simplify(simple).signature() == simple.signature()
    assert lo.count_matmuls(simple) <= lo.count_matmuls(case.op)
    assert_tags_hold(simple)


@settings(max_examples=100, deadline=None)
@given(lst.expressions(max_depth=3, dtype=np.float32))
def test_algebra_in_float32(case):
    assert case.op.dtype == np.float32
    assert_operators_close(case.op, case.dense.astype(np.float32))
    assert_operators_close(lo.simplify(case.op), case.dense.astype(np.float32))
    assert_adjoint(case.op)
