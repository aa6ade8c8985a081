"""Composites that combine operators of one shape: `Sum` and `Scaled` (``A + B``, ``c * A``).

Construction checks shapes and computes tags; it never simplifies (`linops.simplify` does), except that
a chain of one composite stays one node: a `Sum` of sums is one n-ary sum and a scaling of a scaling one
scaling (``c (d A) = (cd) A``), so that 10,000 terms nest no deeper than two (`linops.algebra._depth`). A sum's
solve, log-determinant, inverse and roots are the Woodbury identities, registered for `Sum` by
`linops.algebra._woodbury`. `Product`, `Transpose` and `Inverse` live in `linops.algebra._products`
and are re-exported here.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import is_known_nonnegative
from linops.algebra._base import (
    LinearOperator,
    SharedArrays,
    describe,
    factorize_children,
    is_scalar_like,
    register_composites,
    result_dtype,
    shares_arrays,
    splice,
)
from linops.algebra._depth import composite_levels, nesting_depth
from linops.algebra._eigen import EigenDecomposed
from linops.algebra._products import Product, Transpose, inverse_of


@shares_arrays("terms")
class Sum(LinearOperator):
    """``A_1 + A_2 + ...`` (built by ``A + B``).

    A term that is itself a `Sum` is spliced in, so ``A + B + C`` and ``sum(ops)`` are one flat
    n-ary sum however many terms they have: nothing recurses over the number of terms (products,
    transposes, pytree flattening), and adding a term checks only that term.
    """

    terms: tuple
    _levels: int = eqx.field(static=True, repr=False)
    _shared: SharedArrays = eqx.field(static=True, repr=False)

    def __init__(self, terms: Sequence[LinearOperator]):
        terms = tuple(terms)
        if not terms:
            raise ValueError("Sum: expected at least one operator")
        shape = tuple(terms[0].shape)
        for t in terms[1:]:
            if tuple(t.shape) != shape:
                raise ValueError(
                    f"Sum: cannot add {describe(terms[0])} and {describe(t)}: shapes differ"
                )
        self._levels = composite_levels("Sum", [nesting_depth(t) - (type(t) is Sum) for t in terms])
        self.terms = splice(terms, Sum, "terms")
        type(self)._shared.track(self)

    @property
    def shape(self):
        return tuple(self.terms[0].shape)

    @property
    def dtype(self):
        return result_dtype(*self.terms)

    @property
    def tags(self):
        return _tags.of_sum([t.tags for t in self.terms], self.shape)

    def children(self):
        return self.terms

    def with_children(self, children):
        return Sum(children)

    def signature(self):
        return ("Sum",) + tuple(t.signature() for t in self.terms)

    # functools.reduce, not sum(): sum() would add a leading `0 +` to every product.
    def mv(self, v):
        return functools.reduce(operator.add, (t.mv(v) for t in self.terms))

    def mm(self, V):
        return functools.reduce(operator.add, (t.mm(V) for t in self.terms))

    def rmv(self, u):
        return functools.reduce(operator.add, (t.rmv(u) for t in self.terms))

    def rmm(self, U):
        return functools.reduce(operator.add, (t.rmm(U) for t in self.terms))

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Sum([t.T for t in self.terms])


@closed_forms.diag.register(Sum)
def _sum_diag(op):
    ds = [closed_forms.diag(t) for t in op.terms]
    return NotImplemented if any(d is NotImplemented for d in ds) else sum(ds)


def _constant(c):
    """The value of a Python or NumPy number (part of the structure, as a literal is), else None."""
    return float(c) if isinstance(c, (int, float, np.number)) and not isinstance(c, bool) else None


def constant_product(a: float | None, b: float | None) -> float | None:
    """The constant of a product of two scalars: known when both are."""
    return None if a is None or b is None else a * b


def _reciprocal(c: float | None) -> float | None:
    return None if c is None or c == 0 else 1.0 / c


class Scaled(LinearOperator):
    """``c A`` for a scalar ``c`` (built by ``c * A``).

    Args:
        scalar: a Python number or 0-d array (may be traced).
        op: the operator.
        nonnegative: declare ``c >= 0`` so that a PSD ``A`` stays PSD; a concrete ``c``
            has its sign read, a traced one has none to read.
        constant: the value of ``c`` when it is a literal (read from a Python or NumPy number by
            default). A literal is part of the structure, as it is in a program: ``2.0 * A`` and
            ``3.0 * A`` compile apart, while an array scalar (a prior precision, a step) is data.
    """

    scalar: jax.Array
    op: LinearOperator
    nonnegative: bool = eqx.field(static=True)
    is_one: bool = eqx.field(static=True)
    constant: float | None = eqx.field(static=True)
    _levels: int = eqx.field(static=True, repr=False)

    def __init__(self, scalar, op: LinearOperator, *, nonnegative: bool | None = None, constant: float | None = None):
        if not is_scalar_like(scalar):
            raise ValueError(f"Scaled: expected a scalar, got {describe(scalar)}")
        if not isinstance(op, LinearOperator):
            raise TypeError(f"Scaled: expected a LinearOperator, got {type(op).__name__}")
        constant = _constant(scalar) if constant is None else constant
        if type(op) is Scaled:  # c (d A) is (cd) A: repeated scaling never nests
            nonnegative = (is_known_nonnegative(scalar, nonnegative) and op.nonnegative) or None
            constant = constant_product(constant, op.constant)
            scalar, op = jnp.asarray(scalar) * op.scalar, op.op
        self.constant = constant
        self._levels = composite_levels("Scaled", [nesting_depth(op)])
        concrete = not isinstance(scalar, jax.core.Tracer)
        self.is_one = concrete and bool(np.asarray(scalar) == 1)
        self.nonnegative = is_known_nonnegative(scalar, nonnegative)
        self.scalar = jnp.asarray(scalar)
        self.op = op

    @property
    def shape(self):
        return tuple(self.op.shape)

    @property
    def dtype(self):
        # `self.scalar` (not its dtype) so a Python number stays weakly typed: 2.0 * A keeps A's dtype.
        return jnp.result_type(self.op.dtype, self.scalar)

    @property
    def tags(self):
        return _tags.of_scaled(self.op.tags, 1 if self.nonnegative else None, self.is_one, self.shape)

    def children(self):
        return (self.op,)

    def with_children(self, children):
        return Scaled(self.scalar, children[0], nonnegative=self.nonnegative or None, constant=self.constant)

    def signature(self):
        scalar = ("const", self.constant) if self.constant is not None else id(self.scalar)
        return ("Scaled", scalar, self.op.signature())

    def _c(self, x):
        return self.scalar.astype(jnp.result_type(self.scalar, x)) * x

    def mv(self, v):
        return self._c(self.op.mv(v))

    def mm(self, V):
        return self._c(self.op.mm(V))

    def rmv(self, u):
        return self._c(self.op.rmv(u))

    def rmm(self, U):
        return self._c(self.op.rmm(U))

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return self.with_children((self.op.T,))


@closed_forms.diag.register(Scaled)
def _scaled_diag(op):
    d = closed_forms.diag(op.op)
    return d if d is NotImplemented else op._c(d)


@closed_forms.solve.register(Scaled)
def _scaled_solve(op, b):
    x = closed_forms.solve(op.op, b)
    return x if x is NotImplemented else x / op.scalar


@closed_forms.inv.register(Scaled)
def _scaled_inv(op):
    return Scaled(1.0 / op.scalar, inverse_of(op.op), nonnegative=op.nonnegative or None,
                  constant=_reciprocal(op.constant))


@closed_forms.logdet.register(Scaled)
def _scaled_logdet(op):
    ld = closed_forms.logdet(op.op)
    if ld is NotImplemented:
        return ld
    return ld + op.shape[0] * jnp.log(jnp.abs(op.scalar))


@closed_forms.pinv.register(Scaled)
def _scaled_pinv(op, rtol):
    p = closed_forms.pinv(op.op, rtol)
    return p if p is NotImplemented else Scaled(1.0 / op.scalar, p, nonnegative=op.nonnegative or None,
                                                constant=_reciprocal(op.constant))


@closed_forms.sqrt.register(Scaled)
def _scaled_sqrt(op):
    if not op.nonnegative:
        return NotImplemented
    s = closed_forms.sqrt(op.op)
    return s if s is NotImplemented else Scaled(jnp.sqrt(op.scalar), s, nonnegative=True)


@closed_forms.eigendecompose.register(Scaled)
def _scaled_eigendecompose(op):
    E = closed_forms.eigendecompose(op.op)
    if E is NotImplemented:
        return E
    return EigenDecomposed(E.Q, op.scalar * E.w, nonnegative=(op.nonnegative and E.nonnegative) or None)


@closed_forms.root.register(Scaled)
def _scaled_root(op):
    if not op.nonnegative:
        return NotImplemented
    r = closed_forms.root(op.op)
    return r if r is NotImplemented else Scaled(jnp.sqrt(op.scalar), r, nonnegative=True)


@closed_forms.factorize.register(Scaled)
def _scaled_factorize(op):
    return factorize_children(op, (op.op,))


register_composites(Sum=Sum, Product=Product, Scaled=Scaled, Transpose=Transpose)

__all__ = ["Scaled", "Sum", "constant_product"]
