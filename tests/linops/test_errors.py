"""Bad input raises a clear error naming the operator, the expected and the actual value."""

import jax.numpy as jnp
import pytest

import linops as lo


def test_shape_mismatches_name_both_operators():
    A, B = lo.Dense(jnp.ones((3, 4))), lo.Dense(jnp.ones((5, 2)))
    with pytest.raises(ValueError, match=r"Product: cannot compose Dense\(3, 4\) @ Dense\(5, 2\)"):
        A @ B
    with pytest.raises(ValueError, match=r"Sum: cannot add Dense\(3, 4\) and Dense\(5, 2\)"):
        A + B
    with pytest.raises(ValueError, match=r"Sum: cannot add Dense\(3, 4\) and Dense\(5, 2\)"):
        A - B
    with pytest.raises(ValueError, match=r"Dense\(3, 4\) @ x: expected x of shape \(4,\) or \(4, k\), got \(3,\)"):
        A @ jnp.ones(3)
    with pytest.raises(ValueError, match=r"got \(4, 2, 1\)"):
        A @ jnp.ones((4, 2, 1))


def test_leaf_construction_errors():
    with pytest.raises(ValueError, match=r"Dense: expected a 2-D array, got shape \(3,\)"):
        lo.Dense(jnp.ones(3))
    with pytest.raises(ValueError, match=r"Diagonal: expected a 1-D array"):
        lo.Diagonal(jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r"LowRank: U is \(4, 2\) so d must have 2 entries"):
        lo.LowRank(jnp.ones((4, 2)), jnp.ones(3))
    with pytest.raises(ValueError, match=r"LowRank: U is \(4, 2\) so V must have 2 columns"):
        lo.LowRank(jnp.ones((4, 2)), jnp.ones(2), jnp.ones((4, 3)))
    with pytest.raises(ValueError, match=r"Selection: indices must lie in \[0, 3\)"):
        lo.Selection(jnp.array([0, 3]), 3)
    with pytest.raises(ValueError, match="Selection: indices must be distinct"):
        lo.Selection(jnp.array([1, 1]), 3)
    with pytest.raises(ValueError, match="unknown tag 'spd'"):
        lo.Dense(jnp.eye(2), tags={"spd"})
    with pytest.raises(ValueError, match="Scaled: expected a scalar"):
        lo.Scaled(jnp.ones(2), lo.Identity(2))
    with pytest.raises(TypeError, match="Kronecker: A must be a LinearOperator"):
        lo.Kronecker(jnp.eye(2), lo.Identity(2))
    with pytest.raises(ValueError, match=r"shift: expected a square operator, got Dense\(2, 3\)"):
        lo.shift(lo.Dense(jnp.ones((2, 3))), 1.0)


def test_rectangular_tags_are_dropped():
    assert lo.Dense(jnp.ones((2, 3)), tags={"psd"}).tags == frozenset()
