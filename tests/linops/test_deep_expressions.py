"""Expressions of 10,000 operators: chains of one composite stay flat, so nothing recurses over their length.

Before flattening, `sum()` over about 330 operators, a `+` chain of about 130, `lo.shift` applied about 50
times and an `@` chain of about 85 raised `RecursionError` (building, applying or flattening the pytree).
What still nests (an alternation built in a loop) is refused when built, past `lo.max_nesting()` levels.
"""

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo

from ._util import assert_close

N = 10_000


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


@pytest.mark.slow  # 5 s (10,000 nodes); the nesting limit stays in the default tier
def test_python_sum_of_10000_dense_operators_is_one_flat_sum(rng):
    Ms = rng.normal(size=(N, 3, 3))
    S = sum(lo.Dense(M) for M in Ms)  # starts from 0: `0 + A` is A
    dense = Ms.sum(axis=0)
    assert isinstance(S, lo.Sum) and len(S.terms) == N and lo.nesting_depth(S) == 2
    v = np.array([1.0, -2.0, 0.5])
    assert_close(S @ jnp.asarray(v), dense @ v)
    assert_close(S.T @ jnp.asarray(v), dense.T @ v)
    assert_close(lo.diag(S), np.diagonal(dense))
    leaves, treedef = jax.tree_util.tree_flatten(S)
    assert len(leaves) == N
    assert jax.tree_util.tree_unflatten(treedef, leaves).signature() == S.signature()
    assert "Sum" in repr(lo.Sum(S.terms[:3]))


def test_zero_is_the_only_scalar_an_operator_adds():
    A = lo.Dense(jnp.eye(2))
    assert (0 + A) is A and (A + 0) is A and (0.0 + A) is A
    with pytest.raises(TypeError, match=r"lo\.shift\(A, lam\)"):
        A + 1.0
    with pytest.raises(TypeError, match=r"lo\.shift\(A, lam\)"):
        2 + A


@pytest.mark.slow  # 2-5 s (10,000 nodes); the flat sum and the nesting limit stay in the default tier
def test_a_plus_and_minus_chain_of_10000_operators_matches_numpy(rng):
    Ms = rng.normal(size=(N, 3, 4))
    signs = np.where(np.arange(N) % 3 == 0, -1.0, 1.0)
    s = lo.Dense(Ms[0])
    for M, sign in zip(Ms[1:], signs[1:], strict=True):
        s = s - lo.Dense(M) if sign < 0 else s + lo.Dense(M)
    dense = Ms[0] + np.einsum("k,kij->ij", signs[1:], Ms[1:])
    assert lo.nesting_depth(s) == 3  # a Sum of leaves and of scaled leaves
    v = np.linspace(-1.0, 1.0, 4)
    assert_close(s @ jnp.asarray(v), dense @ v, rtol=1e-9)


@pytest.mark.slow  # 2-5 s (10,000 nodes); the flat sum and the nesting limit stay in the default tier
def test_10000_shifts_are_one_shift_by_the_total(rng):
    X = rng.normal(size=(3, 3))
    G = lo.Dense(X @ X.T, tags={"psd"})
    lams = rng.uniform(0.0, 1e-3, size=N)
    s = G
    for lam in lams:
        s = lo.shift(s, float(lam))
    assert isinstance(s, lo.Sum) and len(s.terms) == 2 and "psd" in s.tags
    dense = X @ X.T + lams.sum() * np.eye(3)
    v = np.array([1.0, 2.0, 3.0])
    assert_close(s @ jnp.asarray(v), dense @ v, rtol=1e-10)
    assert_close(jax.jit(lambda op, x: op @ x)(s, jnp.asarray(v)), dense @ v, rtol=1e-10)
    assert_close(lo.diag(s), np.diagonal(dense), rtol=1e-10)

    def traced(lam):  # a traced shift of a declared-nonnegative shift stays PSD and merges too
        t = lo.shift(lo.shift(G, lam, nonnegative=True), lam, nonnegative=True)
        assert len(t.terms) == 2 and "psd" in t.tags
        return t @ jnp.asarray(v)

    assert_close(jax.jit(traced)(0.5), (X @ X.T + np.eye(3)) @ v)


@pytest.mark.slow  # 2-5 s (10,000 nodes); the flat sum and the nesting limit stay in the default tier
def test_a_product_chain_of_10000_near_identity_matrices_matches_numpy(rng):
    Ms = np.eye(3) + 0.01 * rng.normal(size=(N, 3, 3))
    P = functools.reduce(operator.matmul, (lo.Dense(M) for M in Ms))
    dense = functools.reduce(np.matmul, Ms)  # not multi_dot: its ordering search is cubic in the count
    assert isinstance(P, lo.Product) and len(P.factors) == N and lo.nesting_depth(P) == 2
    v = np.array([0.5, -1.0, 2.0])
    assert_close(P.as_matrix(), dense, rtol=1e-9)
    assert_close(P.T @ jnp.asarray(v), dense.T @ v, rtol=1e-9)
    # Tracing under jit walks all 10,000 factors (compiling that many small products is XLA's business:
    # minutes, not a recursion); a shorter chain is compiled and run.
    jaxpr = jax.make_jaxpr(lambda op, x: op @ x)(P, jnp.asarray(v))
    assert sum(e.primitive.name == "dot_general" for e in jaxpr.jaxpr.eqns) == N
    short = functools.reduce(operator.matmul, (lo.Dense(M) for M in Ms[:40]))
    assert_close(jax.jit(lambda op, x: op @ x)(short, jnp.asarray(v)), functools.reduce(np.matmul, Ms[:40]) @ v)


@pytest.mark.slow  # 2-5 s (10,000 nodes); the flat sum and the nesting limit stay in the default tier
def test_10000_scalings_fold_into_one_scalar():
    A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    s, t = A, A
    for _ in range(N):
        s = 1.0001 * s
        t = jnp.asarray(1.0001) * t  # an array scalar: no constant key, yet no 10,000-long key either
    for op in (s, t):
        assert isinstance(op, lo.Scaled) and op.op is A and lo.nesting_depth(op) == 2
        assert_close(op.as_matrix(), 1.0001**N * np.array([[1.0, 2.0], [3.0, 4.0]]), rtol=1e-9)
    assert s.constant == pytest.approx(1.0001**N)
    G = lo.Dense(jnp.eye(2), tags={"psd"})
    negated_twice = -1.0 * (-1.0 * G)  # (-1)(-1) folds to 1: a PSD operator again
    assert "psd" in negated_twice.tags and negated_twice.op is G


@pytest.mark.slow  # 2-5 s (10,000 nodes); the flat sum and the nesting limit stay in the default tier
def test_simplify_merges_a_product_of_10000_diagonals(rng):
    ds = 1.0 + 1e-3 * rng.normal(size=(N, 4))
    P = functools.reduce(operator.matmul, (lo.Diagonal(d) for d in ds))
    simple = lo.simplify(P)
    assert isinstance(simple, lo.Diagonal)
    assert_close(simple.d, np.prod(ds, axis=0), rtol=1e-9)
    assert lo.simplify(simple) is simple


def _build_until_refused(step, start):
    built = [start]
    with pytest.raises(lo.ExpressionTooDeepError, match=r"lo\.Sum / lo\.Product") as err:
        for _ in range(lo.max_nesting()):
            built.append(step(built[-1]))
    assert isinstance(err.value, RecursionError)  # what code catching recursion expects
    return built


def test_alternating_nesting_is_refused_when_built_and_works_up_to_the_limit():
    a, b = np.diag([0.5, 0.25, 2.0]), np.arange(9.0).reshape(3, 3) / 10
    A, B = lo.Dense(a), lo.Dense(b)
    built = _build_until_refused(lambda s: 0.5 * (s + A), B)  # each step adds two levels
    s = built[-1]
    assert lo.nesting_depth(s) in (lo.max_nesting(), lo.max_nesting() - 1)
    dense = b
    for _ in built[1:]:
        dense = 0.5 * (dense + a)
    v = jnp.array([1.0, -1.0, 2.0])
    assert_close(s @ v, dense @ v)
    assert_close(s.T.as_matrix(), dense.T)
    assert_close(jax.jit(lambda op, x: op @ x)(s, v), dense @ v)
    assert_close(jax.vmap(lambda x: s @ x, in_axes=1, out_axes=1)(jnp.eye(3)), dense)
    assert_close(lo.simplify(s).as_matrix(), dense)
    assert "Sum" in repr(s) and "matrix products" in str(lo.explain(s))

    horner = _build_until_refused(lambda p: p @ A + B, B)  # p(A) = B (I + A + A^2 + ...) + ..., by Horner
    dense = b
    for _ in horner[1:]:
        dense = dense @ a + b
    assert_close(horner[-1] @ v, dense @ v, rtol=1e-9)


def test_the_limit_follows_the_recursion_limit():
    import sys

    old = sys.getrecursionlimit()
    A = lo.Dense(jnp.eye(2))
    try:
        sys.setrecursionlimit(400)
        assert lo.max_nesting() == 50
        with pytest.raises(lo.ExpressionTooDeepError, match="more than the 50"):
            s = A
            for _ in range(30):
                s = 2.0 * (s + A)
    finally:
        sys.setrecursionlimit(old)
    assert lo.max_nesting() == old // 8


def test_a_product_of_a_thousand_factors_warns_before_it_is_compiled_not_when_applied_eagerly():
    """Issue 37: jit of a 3,000-factor product compiled for minutes without a word. Traced (here only to a jaxpr,
    nothing is compiled) a product of 1,000 factors warns with the cost and the alternatives; 999 factors, and
    the same product applied eagerly, do not."""
    import warnings

    factors = [lo.Dense(jnp.eye(3) * 0.999) for _ in range(1000)]
    C = functools.reduce(lambda a, b: a @ b, factors)
    with pytest.warns(UserWarning, match=r"Product: applying a product of 1,000 factors inside a traced function "
                                         r"unrolls 1,000 products.*outside jax\.jit"):
        jax.make_jaxpr(lambda v: C.mv(v))(jnp.ones(3))
    shorter = functools.reduce(lambda a, b: a @ b, factors[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.make_jaxpr(lambda v: shorter.mv(v))(jnp.ones(3))
        y = C @ jnp.ones(3)  # eagerly: operation by operation, not one program of 1,000 products
    np.testing.assert_allclose(y, 0.999**1000 * np.ones(3), rtol=1e-3)
