"""Operators under JAX transformations: jit caching, grad through operators, vmap."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.testing import count_compilations

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


def _fresh_operators():
    """Builders of operators of one structure on new arrays (``i`` varies the values)."""
    rng = np.random.default_rng(0)
    M, J, d = rng.standard_normal((4, 4)), rng.standard_normal((3, 4)), rng.uniform(1.0, 2.0, 3)
    spd = M @ M.T + 4.0 * np.eye(4)

    def congruence(i):
        Jo = lo.Dense(jnp.asarray(J * (1 + i)))
        return Jo.T @ lo.Diagonal(jnp.asarray(d)) @ Jo + lo.Identity(4)

    return {
        "dense": lambda i: lo.Dense(jnp.asarray(M * (1 + i))),
        "inverse of a PSD dense": lambda i: lo.inv(lo.Dense(jnp.asarray(spd * (1 + i)), tags={"psd"})),
        "kronecker": lambda i: lo.Kronecker(lo.Dense(jnp.asarray(M[:2, :2] + i)), lo.Diagonal(jnp.asarray(d[:2]))),
        "congruence plus identity": congruence,
        "projector": lambda i: lo.ProjectorOp.onto_null_space(jnp.asarray(J + i)),
        "diagonal plus low rank": lambda i: lo.Diagonal(jnp.asarray(np.r_[d, 1.0] + i))
        + lo.LowRank(jnp.asarray(M[:, :2]), jnp.ones(2)),
    }


def test_fresh_operators_of_one_structure_trace_and_compile_once():
    """Programs are keyed by structure: operators built one after another on new arrays are equal static keys
    (one trace, one compilation) and each call computes with its own arrays."""
    traces = []

    @jax.jit
    def apply(op, v):
        traces.append(1)
        return op @ v

    v = jnp.linspace(-1.0, 1.0, 4)
    for name, build in _fresh_operators().items():
        traces.clear()
        apply(build(0), v)
        ops = [build(i) for i in (1, 2)]
        with count_compilations() as compiled:
            outs = [apply(op, v) for op in ops]
        for op, out in zip(ops, outs, strict=True):
            assert_close(out, op.as_matrix() @ np.asarray(v), rtol=1e-5)
        assert len(traces) == 1, f"{name}: traced {len(traces)} times"
        assert compiled == [], f"{name}: {len(compiled)} compilations for fresh operators"
        assert jax.tree_util.tree_structure(build(3)) == jax.tree_util.tree_structure(build(4)), name


def test_operators_applied_eagerly_compile_one_program_per_structure():
    """Outside a trace, ``A @ x`` and ``A.as_matrix()`` are one compiled program per structure and shape: a
    composite's first product compiles one program (not one per `jax.numpy` operation it meets), fresh operators of
    one structure compile nothing more, and the values are those of the operation-by-operation product."""
    v = jnp.linspace(-1.0, 1.0, 4)
    for name, build in _fresh_operators().items():
        A = build(0)  # built (its construction compiled) before counting
        with count_compilations() as first:
            A @ v
        assert len(first) == 1, f"{name}: {len(first)} compilations for one eager product"
        A.as_matrix()
        ops = [build(i) for i in (1, 2)]
        with count_compilations() as compiled:
            outs = [op @ v for op in ops]
            mats = [op.as_matrix() for op in ops]
        assert compiled == [], f"{name}: {len(compiled)} compilations for fresh operators"
        for op, out, mat in zip(ops, outs, mats, strict=True):
            reference = np.asarray(jax.vmap(op.mv)(jnp.eye(4))).T  # operation by operation
            assert_close(out, reference @ np.asarray(v), rtol=1e-5)
            assert_close(mat, reference, rtol=1e-5)


def test_a_ggn_product_applied_eagerly_compiles_once():
    """``G @ v`` outside jax.jit on a GGN operator (whose product streams over batches) compiles on its first call
    only, for a fresh operator on new parameters too; its product before compiled its batch loop at every call
    (a new program per call). Checked against the GGN's dense definition, J^T J / sigma^2."""
    fn = lambda w, x: jnp.tanh(x @ w[:6].reshape(3, 2)) @ w[6:].reshape(2, 2)  # noqa: E731
    X, Y = jnp.asarray(np.random.default_rng(0).standard_normal((8, 3))), jnp.zeros((8, 2))
    v = jnp.linspace(-1.0, 1.0, 10)
    build = lambda w: lo.GGNOp(fn, w, X, Y, lo.likelihoods.Gaussian(0.5), batch_size=3)  # noqa: E731
    build(jnp.linspace(-1.0, 1.0, 10)) @ v
    ws = [jnp.linspace(-1.0, 1.0, 10), jnp.linspace(0.5, 2.0, 10)]
    with count_compilations() as compiled:
        outs = [build(w) @ v for w in ws]
    assert compiled == []
    for w, out in zip(ws, outs, strict=True):
        J = jax.jacobian(lambda p: jax.vmap(lambda x: fn(p, x))(X).reshape(-1))(w)
        assert_close(out, np.asarray(J.T @ J @ v) / 0.25, rtol=1e-10)


def test_lowering_fresh_operators_of_one_structure_reuses_the_program():
    build = _fresh_operators()["congruence plus identity"]
    v = jnp.ones(4)
    lo.lower(build(0)) @ v
    ops = [build(i) for i in (1, 2)]
    with count_compilations() as compiled:
        outs = [lo.lower(op) @ v for op in ops]
    for op, out in zip(ops, outs, strict=True):
        assert_close(out, op.as_matrix() @ np.asarray(v), rtol=1e-5)
    assert compiled == []


def test_shared_leaves_are_part_of_the_key_and_survive_flattening():
    """``J^T D J`` (one ``J``) and ``K^T D J`` differ as static keys; through jit, vmap and eqx.partition the
    shared leaf stays one array, so the congruence is still PSD where it is traced."""
    rng = np.random.default_rng(1)
    J, K = (lo.Dense(jnp.asarray(rng.standard_normal((2, 3)))) for _ in range(2))
    D = lo.Diagonal(jnp.array([1.0, 2.0]))
    same, other = J.T @ D @ J, K.T @ D @ J
    assert "psd" in same.tags and "psd" not in other.tags
    assert jax.tree_util.tree_structure(same) != jax.tree_util.tree_structure(other)

    seen = []

    @jax.jit
    def solve(G, b):
        seen.append("psd" in G.tags)
        return lo.solve(lo.shift(G, 1.0, nonnegative=True), b, method="cg", rtol=1e-6).value if seen[-1] else G @ b

    b = jnp.array([1.0, -1.0, 0.5])
    assert_close(solve(same, b), np.linalg.solve(same.as_matrix() + np.eye(3), b), rtol=1e-4)
    assert_close(solve(other, b), other.as_matrix() @ np.asarray(b), rtol=1e-5)
    assert seen == [True, False]

    back = jax.jit(lambda e: e)(same)  # an output keeps its sharing too
    assert back.factors[0].op.matrix is back.factors[2].matrix and "psd" in back.tags
    dynamic, static = eqx.partition(same, eqx.is_array)
    rebuilt = eqx.combine(dynamic, static)
    assert rebuilt.factors[0].op.matrix is rebuilt.factors[2].matrix
    batched = jax.vmap(lambda s, G: s * (G @ b), in_axes=(0, None))(jnp.arange(2.0), same)
    assert_close(batched[1], same.as_matrix() @ np.asarray(b), rtol=1e-5)


def test_operators_passed_separately_are_never_merged():
    """Inside one trace, two arguments are two operators even when the caller passed one object twice: the
    program is shared with calls on different operators, so it may assume nothing (a missed rewrite, never a
    wrong value)."""
    A = lo.Dense(jnp.array([[2.0, 1.0], [0.0, 3.0]]))
    B = lo.Dense(jnp.array([[1.0, 0.0], [4.0, 1.0]]))
    f = jax.jit(lambda X, Y, v: lo.simplify(lo.inv(X) @ Y) @ v)
    v = jnp.array([1.0, 2.0])
    assert_close(f(A, A, v), v, rtol=1e-5)
    assert_close(f(A, B, v), np.linalg.solve(A.as_matrix(), B.as_matrix() @ np.asarray(v)), rtol=1e-5)
