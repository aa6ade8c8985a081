"""Composites that combine operators of one shape: `Sum` and `Scaled` (``A + B``, ``c * A``).

Construction checks shapes and computes tags; it never simplifies (`linops.simplify` does), except that
a chain of one composite stays one node: a `Sum` of sums is one n-ary sum and a scaling of a scaling one
scaling (``c (d A) = (cd) A``), so that 10,000 terms nest no deeper than two (`linops._depth`). The
closed forms of a sum come from the rules registered with `register_sum_closed_form` (the Woodbury
identities in `linops._woodbury`). `Product`, `Transpose` and `Inverse` live in `linops._products`
and are re-exported here.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops import _tags
from linops._arrays import is_known_nonnegative
from linops._base import (
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
from linops._depth import composite_levels, nesting_depth
from linops._eigen import EigenDecomposed
from linops._products import Product, Transpose, inverse_of

_SUM_CLOSED_FORMS: dict[str, list[Callable]] = {}


def register_sum_closed_form(hook: str, rule: Callable) -> None:
    """Give `Sum` a closed form: ``rule(sum, *args)`` returns the hook's value or NotImplemented.

    ``hook`` is the name of a closed form without its underscore (``"solve"``, ``"logdet"``, ...);
    rules are tried in the order registered.
    """
    _SUM_CLOSED_FORMS.setdefault(hook, []).append(rule)


def _sum_closed_form(hook, op, *args):
    for rule in _SUM_CLOSED_FORMS.get(hook, ()):
        out = rule(op, *args)
        if out is not NotImplemented:
            return out
    return NotImplemented


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

    def _diag(self):
        ds = [t._diag() for t in self.terms]
        return NotImplemented if any(d is NotImplemented for d in ds) else sum(ds)

    def _solve(self, b):
        return _sum_closed_form("solve", self, b)

    def _logdet(self):
        return _sum_closed_form("logdet", self)

    def _inv(self):
        return _sum_closed_form("inv", self)

    def _sqrt(self):
        return _sum_closed_form("sqrt", self)

    def _root(self):
        return _sum_closed_form("root", self)


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

    def _diag(self):
        d = self.op._diag()
        return d if d is NotImplemented else self._c(d)

    def _solve(self, b):
        x = self.op._solve(b)
        return x if x is NotImplemented else x / self.scalar

    def _inv(self):
        return Scaled(1.0 / self.scalar, inverse_of(self.op), nonnegative=self.nonnegative or None,
                      constant=_reciprocal(self.constant))

    def _logdet(self):
        ld = self.op._logdet()
        if ld is NotImplemented:
            return ld
        return ld + self.shape[0] * jnp.log(jnp.abs(self.scalar))

    def _pinv(self, rtol):
        p = self.op._pinv(rtol)
        return p if p is NotImplemented else Scaled(1.0 / self.scalar, p, nonnegative=self.nonnegative or None,
                                                    constant=_reciprocal(self.constant))

    def _sqrt(self):
        if not self.nonnegative:
            return NotImplemented
        s = self.op._sqrt()
        return s if s is NotImplemented else Scaled(jnp.sqrt(self.scalar), s, nonnegative=True)

    def _eigendecompose(self):
        E = self.op._eigendecompose()
        if E is NotImplemented:
            return E
        return EigenDecomposed(E.Q, self.scalar * E.w, nonnegative=(self.nonnegative and E.nonnegative) or None)

    def _root(self):
        if not self.nonnegative:
            return NotImplemented
        r = self.op._root()
        return r if r is NotImplemented else Scaled(jnp.sqrt(self.scalar), r, nonnegative=True)

    def _factorize(self):
        return factorize_children(self, (self.op,))


register_composites(Sum=Sum, Product=Product, Scaled=Scaled, Transpose=Transpose)

__all__ = ["Scaled", "Sum", "constant_product", "register_sum_closed_form"]
