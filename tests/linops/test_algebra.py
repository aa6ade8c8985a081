"""Property tests of the operator algebra over random expression trees (dense references)."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import linops as lo
from linops.testing import assert_adjoint, assert_operator_matches, assert_tags_hold
from linops.testing import strategies as lst

from ._util import assert_close


@given(lst.expressions())
def test_products_and_as_matrix_match_the_dense_reference(case):
    n = case.dense.shape[1]
    v = np.linspace(-1.0, 2.0, n)
    V = np.stack([v, v**2 - 1.0], axis=1)
    assert_close(case.op @ jnp.asarray(v), case.dense @ v)
    assert_close(case.op @ jnp.asarray(V), case.dense @ V)
    assert_close(case.op.as_matrix(), case.dense)
    assert_close(case.op.T.as_matrix(), case.dense.T)


@given(lst.expressions(max_depth=2), lst.expressions(max_depth=2))
def test_transpose_of_product_is_product_of_transposes(a, b):
    n = a.dense.shape[0]
    if b.dense.shape[0] != n:
        b = lst.Case(lo.Identity(n) + lo.Zero(n), np.eye(n))
    lhs = (a.op @ b.op).T
    rhs = b.op.T @ a.op.T
    assert_close(lhs.as_matrix(), rhs.as_matrix())
    assert_close(lhs.as_matrix(), (a.dense @ b.dense).T)


@given(lst.expressions())
def test_adjoint_identity_and_linearity(case):
    assert_adjoint(case.op)
    n = case.dense.shape[1]
    x, y = jnp.linspace(0.0, 1.0, n), jnp.cos(jnp.arange(n, dtype=jnp.float64))
    assert_close(case.op @ (2.5 * x - y), 2.5 * (case.op @ x) - case.op @ y)


@given(lst.expressions())
def test_every_claimed_tag_holds(case):
    assert_tags_hold(case.op)


@given(lst.operators())
def test_every_leaf_conforms(case):
    assert_operator_matches(case.op, case.dense)


@given(st.sampled_from(lst.SIZES), st.sampled_from(lst.SIZES), st.data())
def test_rectangular_leaves_conform(m, n, data):
    case = data.draw(lst.rectangular(m, n))
    assert_operator_matches(case.op, case.dense)


@given(lst.expressions())
def test_simplify_is_sound(case):
    assert_close(lo.simplify(case.op).as_matrix(), case.dense)


@given(lst.expressions())
def test_simplify_is_idempotent(case):
    once = lo.simplify(case.op)
    assert lo.simplify(once).signature() == once.signature()


@given(lst.expressions())
def test_simplify_never_adds_matrix_products(case):
    assert lo.count_matmuls(lo.simplify(case.op)) <= lo.count_matmuls(case.op)


@given(lst.expressions())
def test_simplify_keeps_claimed_tags_true(case):
    assert_tags_hold(lo.simplify(case.op))


@given(lst.expressions(max_depth=2))
def test_expressions_pass_through_jit_and_lower(case):
    n = case.dense.shape[1]
    v = jnp.linspace(-1.0, 1.0, n)
    out = jax.jit(lambda op, v: op @ v)(case.op, v)
    assert_close(out, case.dense @ v)
    assert_close(lo.lower(case.op) @ v, case.dense @ v)
    assert_close(lo.lower(case.op).T @ v, case.dense.T @ v)


def test_congruence_is_psd_and_shift_declared_nonnegative_stays_psd():
    J = lo.Dense(jnp.arange(6.0).reshape(2, 3))
    H = lo.Diagonal(jnp.array([1.0, 2.0]))
    G = J.T @ H @ J
    assert "psd" in G.tags and "symmetric" in G.tags
    assert "psd" not in (J.T @ lo.Diagonal(jnp.array([1.0, -2.0])) @ J).tags
    assert "symmetric" in (J.T @ lo.Diagonal(jnp.array([1.0, -2.0])) @ J).tags
    assert "psd" not in (J @ G @ J.T @ J).tags

    def traced(lam):
        declared = lo.shift(G, lam, nonnegative=True)
        undeclared = lo.shift(G, lam)
        return "psd" in declared.tags, "psd" in undeclared.tags

    flags = []
    jax.jit(lambda lam: flags.append(traced(lam)) or lam)(0.3)
    assert flags == [(True, False)]
    assert "psd" in lo.shift(G, 0.3).tags  # a concrete shift has its sign read
    assert "psd" not in lo.shift(G, -0.3).tags


def test_simplify_day_one_rules():
    A = lo.Dense(jnp.arange(9.0).reshape(3, 3))
    B = lo.Dense(jnp.ones((3, 3)))
    I3 = lo.Identity(3)
    assert lo.simplify(A.T.T) is A
    assert lo.simplify((A @ B).T).signature() == lo.Product((B.T, A.T)).signature()
    scaled = lo.simplify((2.0 * A).T)
    assert isinstance(scaled, lo.Scaled) and scaled.op.signature() == A.T.signature()
    assert lo.simplify(I3 @ A @ I3) is A
    assert isinstance(lo.simplify(lo.Zero(3) @ A), lo.Zero)
    folded = lo.simplify(2.0 * (3.0 * (A @ (0.5 * B))))
    assert isinstance(folded, lo.Scaled) and float(folded.scalar) == 3.0
    flat = lo.simplify((A @ B) @ (A @ B))
    assert isinstance(flat, lo.Product) and len(flat.factors) == 4
    d1, d2 = lo.Diagonal(jnp.array([1.0, 2.0, 3.0])), lo.Diagonal(jnp.array([2.0, 2.0, 2.0]))
    dd = lo.simplify(d1 @ d2)
    assert isinstance(dd, lo.Diagonal)
    np.testing.assert_allclose(dd.d, [2.0, 4.0, 6.0])
    S = lo.Selection(jnp.array([0, 2]), 3)
    assert isinstance(lo.simplify(S @ S.T), lo.Identity)
    assert not isinstance(lo.simplify(S.T @ S), lo.Identity)  # embedding after restriction is a mask
    spd = lo.Dense(jnp.eye(3) * 2.0, tags={"psd"})
    assert isinstance(lo.simplify(lo.inv(spd) @ spd), lo.Identity)
    assert isinstance(lo.simplify(spd @ lo.inv(spd)), lo.Identity)
    assert lo.inv(lo.inv(spd)) is spd


def test_projector_rules_fire_after_a_jit_round_trip():
    """An expression that went through `jax.jit` still knows which of its leaves are one operator (its
    pytree structure records the pattern of shared leaves), so the rules fire on it; an operator built
    separately, on other arrays, is another operator however alike its structure."""
    M = jnp.array([[1.0, 2.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    P = lo.ProjectorOp.onto_null_space(M)
    exprs = (P @ P, P.T @ P @ P.T, P.complement() @ P, (lo.Identity(4) - P) @ P, lo.Identity(4) - P)
    back = jax.jit(lambda e: e)(exprs)  # new Python objects holding new arrays
    assert back[0].factors[0] is not P and back[0].factors[0].W is back[0].factors[1].W
    for e in back[:2]:
        simple = lo.simplify(e)
        assert isinstance(simple, lo.ProjectorOp) and simple.signature() == e.factors[0].signature()
        assert_close(simple.as_matrix(), P.as_matrix(), atol=1e-6)
    assert isinstance(lo.simplify(back[2]), lo.Zero)
    assert isinstance(lo.simplify(back[3]), lo.Zero)
    assert "projector" in lo.simplify(back[4]).tags

    Q = lo.ProjectorOp.onto_null_space(M)  # the same structure and values, another operator
    assert jax.tree_util.tree_structure(Q) == jax.tree_util.tree_structure(P)
    assert isinstance(lo.simplify(Q @ P), lo.Product)
    assert not isinstance(lo.simplify(Q.complement() @ P), lo.Zero)

    def inside(p, v):  # rules also fire on traced operators
        simple = lo.simplify(p @ p)
        assert simple.signature() == p.signature()
        return simple @ v

    v = jnp.arange(4.0)
    np.testing.assert_allclose(jax.jit(inside)(P, v), P @ v, atol=1e-12)


def test_explain_reports_tree_tags_and_products():
    J = lo.Dense(jnp.ones((2, 3)))
    text = str(lo.explain(lo.Identity(3) @ J.T @ lo.Diagonal(jnp.ones(2)) @ J))
    assert text.splitlines()[0] == "Product(3, 3) [psd, symmetric]"
    assert "matrix products: 2 as written, 2 after simplify" in text
    P = lo.ProjectorOp.onto_row_space(jnp.ones((1, 3)))
    assert "8 as written, 4 after simplify" in str(lo.explain(P @ P))


def test_scalar_times_operator_accepts_arrays_and_rejects_vectors():
    A = lo.Dense(jnp.eye(2))
    np.testing.assert_allclose((jnp.asarray(3.0) * A) @ jnp.ones(2), [3.0, 3.0])
    np.testing.assert_allclose((A / 2.0) @ jnp.ones(2), [0.5, 0.5])
    np.testing.assert_allclose(jnp.ones(2) @ lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]])), [4.0, 6.0])
    assert (-A).signature() != A.signature()
    try:
        jnp.ones(2) * A
    except TypeError:
        pass
    else:
        raise AssertionError("vector * operator must not be accepted")


class _Scale(lo.LinearOperator):
    """A user operator with data and no stable key."""

    c: jax.Array

    @property
    def shape(self):
        return (3, 3)

    @property
    def dtype(self):
        return self.c.dtype

    def mv(self, v):
        return self.c * v


def test_user_operators_without_a_key_are_never_confused():
    A1, A2 = _Scale(jnp.asarray(2.0)), _Scale(jnp.asarray(3.0))
    assert A1.signature() != A2.signature()
    # (an operator with no closed-form solve needs its method named when its inverse is built)
    assert not isinstance(lo.simplify(lo.inv(A1, method="dense") @ A2), lo.Identity)
    assert "psd" not in (A1.T @ A2).tags
    assert "psd" in (A1.T @ A1).tags  # the same object is still recognised


def test_identity_tagged_factors_are_dropped():
    A = lo.Dense(jnp.arange(16.0).reshape(4, 4))
    II = lo.Kronecker(lo.Identity(2), lo.Identity(2))
    assert "identity" in II.tags
    assert lo.simplify(II @ A @ II) is A
