"""`linops.closed_forms`: a user's operator gives closed forms through the same tables as the library's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo

from ._util import assert_close


class Ones(lo.LinearOperator):
    """c 1 1^T + I, n x n: symmetric PSD, with closed forms by Sherman-Morrison."""

    c: jax.Array
    n: int = 3

    @property
    def shape(self):
        return (self.n, self.n)

    @property
    def dtype(self):
        return self.c.dtype

    @property
    def tags(self):
        return frozenset({lo.tags.symmetric, lo.tags.psd})

    def mv(self, v):
        return v + self.c * jnp.sum(v)

    def transpose(self):
        return self


class Marked(Ones):
    """A subclass: it inherits its base's rules and may add its own."""


@lo.closed_forms.diag.register(Ones)
def _ones_diag(op):
    return jnp.full(op.n, 1.0 + op.c)


@lo.closed_forms.solve.register(Ones)
def _ones_solve(op, b):  # (I + c 1 1^T)^{-1} = I - c/(1 + c n) 1 1^T
    return b - op.c / (1.0 + op.c * op.n) * jnp.sum(b, axis=0)


@lo.closed_forms.logdet.register(Ones)
def _ones_logdet(op):
    return jnp.log1p(op.c * op.n)


def _dense(c, n=3):
    return np.eye(n) + c * np.ones((n, n))


def test_a_users_rules_serve_the_public_functions_and_compose():
    A = Ones(jnp.asarray(0.5))
    M = _dense(0.5)
    b = jnp.arange(3.0)
    assert_close(lo.diag(A), np.diag(M))
    assert_close(lo.trace(A), np.trace(M))  # the tags' rule: the sum of the diagonal
    assert_close(lo.solve(A, b).value, np.linalg.solve(M, b))
    assert_close(lo.logdet(A), np.linalg.slogdet(M)[1])
    # composites ask their operands' tables: a Kronecker product, a scaling, a block diagonal, a lowered operator
    K = lo.Kronecker(A, lo.Diagonal(jnp.array([2.0, 3.0])))
    assert_close(lo.logdet(K), np.linalg.slogdet(np.kron(M, np.diag([2.0, 3.0])))[1])
    assert_close(lo.logdet(3.0 * A), np.linalg.slogdet(3.0 * M)[1])
    assert_close(lo.diag(lo.BlockDiagonal([A, A])), np.concatenate([np.diag(M)] * 2))
    assert_close(lo.solve(lo.lower(A), b).value, np.linalg.solve(M, b))
    assert_close(lo.inv(A) @ b, np.linalg.solve(M, b))  # the inverse's products are the rule's solves
    with pytest.raises(ValueError, match="eigh"):  # no rule: the function asks for a method
        lo.eigh(A)


def test_rules_are_searched_along_the_mro_and_not_implemented_falls_through():
    seen = []

    @lo.closed_forms.diag.register(Marked)
    def _only_for_positive(op):
        seen.append("Marked")
        return NotImplemented  # declines: the base's rule answers

    A = Marked(jnp.asarray(2.0))
    assert_close(lo.diag(A), np.diag(_dense(2.0)))
    assert seen == ["Marked"]
    assert_close(lo.solve(A, jnp.ones(3)).value, np.linalg.solve(_dense(2.0), np.ones(3)))  # inherited
    # `after` is super(): the answer of the bases alone, skipping Marked's own rule
    assert_close(lo.closed_forms.diag.after(Marked, A), np.diag(_dense(2.0)))
    assert seen == ["Marked"]


def test_a_class_with_no_rule_gets_the_tags_answers_and_a_refusal():
    Q = lo.FunctionOp(lambda v: v[::-1], (3, 3), jnp.float32, tags={"orthogonal", "symmetric"})
    assert_close(lo.logdet(Q), 0.0)  # orthogonal: |det Q| = 1, a rule registered for LinearOperator
    assert lo.closed_forms.diag(Q) is NotImplemented
    with pytest.raises(ValueError, match="method='exact'"):
        lo.diag(Q)


def test_rules_lists_every_rule_with_where_it_is_defined():
    rules = dict((cls, where) for cls, where in lo.closed_forms.logdet.rules() if cls is Ones)
    assert rules[Ones].endswith(f"test_closed_forms.py:{_ones_logdet.__code__.co_firstlineno}")
    woodbury = [where for cls, where in lo.closed_forms.solve.rules() if cls is lo.Sum]
    assert len(woodbury) == 2 and all("_woodbury.py" in w for w in woodbury)


def test_register_refuses_what_is_not_a_class_or_not_a_rule():
    with pytest.raises(TypeError, match="closed_forms.diag.register: expected an operator class"):
        lo.closed_forms.diag.register("Ones")
    with pytest.raises(TypeError, match=r"register\(Ones\): expected a callable rule"):
        lo.closed_forms.diag.register(Ones, 3)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_svd_of_a_dense_operator_and_densely_of_any(shape):
    M = np.random.default_rng(0).standard_normal(shape)
    U, s, V = lo.svd(lo.Dense(jnp.asarray(M)))
    k = min(shape)
    assert U.shape == (shape[0], k) and V.shape == (shape[1], k)
    assert_close(s, np.linalg.svd(M, compute_uv=False))
    assert_close((U.as_matrix() * s[None, :]) @ V.as_matrix().T, M)
    assert_close(U.as_matrix().T @ U.as_matrix(), np.eye(k))
    F = lo.FunctionOp(lambda v: jnp.asarray(M) @ v, shape, jnp.float64, rmv=lambda u: jnp.asarray(M).T @ u)
    with pytest.raises(ValueError, match="svd: .* has no closed form here; choose a method explicitly: method='dense'"):
        lo.svd(F)
    assert_close(lo.svd(F, method="dense")[1], np.linalg.svd(M, compute_uv=False))
