"""Round trips between linops and lineax keep products and tags."""

import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import linops as lo

from ._util import assert_close


def test_to_lineax_keeps_products_and_tags():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((4, 4))
    spd = M @ M.T + 4 * np.eye(4)
    A = lo.Dense(jnp.asarray(spd), tags={"psd"})
    lxA = lo.to_lineax(A)
    assert lx.is_positive_semidefinite(lxA) and lx.is_symmetric(lxA)
    b = jnp.arange(4.0)
    assert_close(lx.linear_solve(lxA, b).value, np.linalg.solve(spd, b))
    composite = A + lo.Diagonal(jnp.ones(4))
    lxC = lo.to_lineax(composite)
    assert lx.is_positive_semidefinite(lxC)
    assert_close(lxC.mv(b), (spd + np.eye(4)) @ b)
    assert_close(lxC.as_matrix(), spd + np.eye(4))
    sol = lx.linear_solve(lxC, b, lx.CG(rtol=1e-10, atol=1e-10))
    assert_close(sol.value, np.linalg.solve(spd + np.eye(4), b), rtol=1e-8)
    assert isinstance(lo.to_lineax(lo.Identity(3)), lx.IdentityLinearOperator)
    assert isinstance(lo.to_lineax(lo.Diagonal(jnp.ones(3))), lx.DiagonalLinearOperator)


def test_from_lineax_round_trip():
    M = jnp.array([[2.0, 1.0], [1.0, 3.0]])
    A = lo.from_lineax(lx.MatrixLinearOperator(M, lx.positive_semidefinite_tag))
    assert isinstance(A, lo.Dense) and "psd" in A.tags
    f = lx.FunctionLinearOperator(lambda v: M @ v, jnp.zeros(2), lx.symmetric_tag)
    B = lo.from_lineax(f)
    assert "symmetric" in B.tags and "psd" not in B.tags
    v = jnp.array([1.0, -1.0])
    assert_close(B @ v, M @ v)
    assert_close(B.T @ v, M.T @ v)
    back = lo.from_lineax(lo.to_lineax(lo.Dense(M, tags={"psd"})))
    assert_close(back.as_matrix(), M)
    assert isinstance(lo.from_lineax(lx.IdentityLinearOperator(jnp.zeros(3))), lo.Identity)
    with pytest.raises(TypeError, match="from_lineax: expected a lineax.AbstractLinearOperator"):
        lo.from_lineax(M)
    tree_op = lx.FunctionLinearOperator(lambda v: v, {"a": jnp.zeros(2)})
    with pytest.raises(ValueError, match="expected 1-D vectors"):
        lo.from_lineax(tree_op)
