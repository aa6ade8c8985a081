"""Operators under JAX transformations: jit caching, grad through operators, vmap."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo

from ._util import assert_close


def test_reusing_an_operator_does_not_recompile():
    traces = []

    @jax.jit
    def apply(op, v):
        traces.append(1)
        return op @ v

    rng = np.random.default_rng(0)
    A = lo.Dense(jnp.asarray(rng.standard_normal((4, 4))))
    expr = A.T @ lo.Diagonal(jnp.ones(4)) @ A + lo.Identity(4)
    for i in range(3):
        apply(expr, jnp.full(4, float(i)))
    assert len(traces) == 1
    L = lo.lower(expr)
    for i in range(3):
        assert_close(L @ jnp.full(4, float(i)), expr.as_matrix() @ np.full(4, float(i)))


def test_new_data_in_the_same_operator_does_not_recompile():
    """Arrays are pytree leaves: changing values (same key) reuses the compiled program."""
    traces = []

    @jax.jit
    def apply(op, v):
        traces.append(1)
        return op @ v

    A = lo.Dense(jnp.eye(3))
    B = eqx.tree_at(lambda a: a.matrix, A, 2.0 * jnp.eye(3))
    apply(A, jnp.ones(3))
    assert_close(apply(B, jnp.ones(3)), 2.0 * np.ones(3))
    assert len(traces) == 1


def test_grad_flows_through_operator_leaves():
    v = jnp.array([1.0, 2.0])
    M = jnp.array([[1.0, 2.0], [3.0, 4.0]])

    def loss(op):
        return jnp.sum((op.T @ op + lo.Identity(2)) @ v)

    g = jax.grad(loss)(lo.Dense(M))
    ref = jax.grad(lambda m: jnp.sum((m.T @ m + jnp.eye(2)) @ v))(M)
    assert_close(g.matrix, ref)
    d = jnp.array([1.0, 3.0])
    g_logdet = jax.grad(lambda d: lo.logdet(lo.Diagonal(d) + lo.LowRank(jnp.ones((2, 1)), jnp.ones(1))))(d)
    ref_logdet = jax.grad(lambda d: jnp.linalg.slogdet(jnp.diag(d) + jnp.ones((2, 2)))[1])(d)
    assert_close(g_logdet, ref_logdet)


def test_vmap_over_vectors_and_over_operator_data():
    A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    V = jnp.arange(6.0).reshape(3, 2)
    assert_close(jax.vmap(lambda v: A @ v)(V), V @ A.matrix.T)
    ds = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    out = jax.vmap(lambda d: lo.solve(lo.Diagonal(d), jnp.ones(2)).value)(ds)
    assert_close(out, 1.0 / ds)
