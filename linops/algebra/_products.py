"""Composites that compose maps: `Product`, `Transpose` and `Inverse`.

Construction checks shapes and computes tags; it never simplifies (`linops.simplify` does).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import equinox as eqx
import jax

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._base import (
    LinearOperator,
    SharedArrays,
    describe,
    factorize_children,
    result_dtype,
    shares_arrays,
    splice,
)
from linops.algebra._depth import composite_levels, nesting_depth
from linops.algebra._eigen import EigenDecomposed
from linops.algebra._solvers import solve_checked


def transpose_signature(op: LinearOperator, tags: frozenset | None = None):
    """The signature of ``op.T`` without building it (``tags``: ``op.tags``, when already known)."""
    if _tags.symmetric in (op.tags if tags is None else tags):
        return op.signature()
    if isinstance(op, Transpose):
        return op.op.signature()
    return ("Transpose", op.signature())


LONG_PRODUCT = 1000
"""Products with this many factors or more warn when traced into a compiled program (`_warn_long_trace`)."""


def _warn_long_trace(op, v) -> None:
    """Warn, before XLA's compile, that a product of many factors traced under `jax.jit` unrolls one product per
    factor into the program, and XLA's compile time grows with their count."""
    if len(op.factors) >= LONG_PRODUCT and isinstance(v, jax.core.Tracer):
        warnings.warn(f"Product: applying a product of {len(op.factors):,} factors inside a traced function unrolls "
                      f"{len(op.factors):,} products into one program; XLA's compile time grows with them (on 2 CPU "
                      "cores 13 s for 1,000 factors, 100 s for 3,000). Applied outside jax.jit it compiles nothing "
                      "new (0.16 s for 1,000 small factors); or stack equal factors and apply them with "
                      "jax.lax.scan, or fold them into one matrix first", stacklevel=3)


@shares_arrays("factors")
class Product(LinearOperator):
    """``A_1 A_2 ... A_k`` (built by ``A @ B``); applied right to left, factor by factor in a loop.

    A factor that is itself a `Product` is spliced in, so ``A @ B @ C`` is one flat n-ary product
    however many factors it has (nothing recurses over the number of factors), and composing
    checks only the shapes where the operands meet.
    """

    factors: tuple
    _levels: int = eqx.field(static=True, repr=False)
    _shared: SharedArrays = eqx.field(static=True, repr=False)

    def __init__(self, factors: Sequence[LinearOperator]):
        factors = tuple(factors)
        if not factors:
            raise ValueError("Product: expected at least one operator")
        for left, right in zip(factors[:-1], factors[1:], strict=True):
            if left.shape[1] != right.shape[0]:
                raise ValueError(
                    f"Product: cannot compose {describe(left)} @ {describe(right)}: "
                    f"{type(left).__name__} takes vectors of length {left.shape[1]} but "
                    f"{type(right).__name__} returns vectors of length {right.shape[0]}"
                )
        self._levels = composite_levels("Product", [nesting_depth(f) - (type(f) is Product) for f in factors])
        self.factors = splice(factors, Product, "factors")
        type(self)._shared.track(self)

    @property
    def shape(self):
        return (self.factors[0].shape[0], self.factors[-1].shape[1])

    @property
    def dtype(self):
        return result_dtype(*self.factors)

    def flat_factors(self) -> tuple:
        """The factors with nested products expanded (``(AB)C`` reads ``A, B, C``)."""
        if not any(isinstance(f, Product) for f in self.factors):  # always, unless built around `__init__`
            return self.factors
        out, stack = [], list(reversed(self.factors))
        while stack:  # a loop, not recursion: any depth
            f = stack.pop()
            if isinstance(f, Product):
                stack.extend(reversed(f.factors))
            else:
                out.append(f)
        return tuple(out)

    @property
    def tags(self):
        fs = self.flat_factors()
        k = len(fs)
        tags = [f.tags for f in fs]  # once each: asking a factor twice costs 2^depth on nested expressions
        pairs_match = k >= 2 and all(
            transpose_signature(fs[i], tags[i]) == fs[k - 1 - i].signature() for i in range(k // 2)
        )
        middle = tags[k // 2] if (pairs_match and k % 2 == 1) else None
        idempotent = _tags.projector in tags[0] and len({f.signature() for f in fs}) == 1
        return _tags.of_product(
            tags,
            self.shape,
            congruence_middle=middle,
            is_congruence=pairs_match,
            is_idempotent_square=idempotent,
        )

    def children(self):
        return self.factors

    def with_children(self, children):
        return Product(children)

    def signature(self):
        return ("Product",) + tuple(f.signature() for f in self.flat_factors())

    def mv(self, v):
        _warn_long_trace(self, v)
        for f in reversed(self.factors):
            v = f.mv(v)
        return v

    def mm(self, V):
        _warn_long_trace(self, V)
        for f in reversed(self.factors):
            V = f.mm(V)
        return V

    def rmv(self, u):
        _warn_long_trace(self, u)
        for f in self.factors:
            u = f.rmv(u)
        return u

    def rmm(self, U):
        _warn_long_trace(self, U)
        for f in self.factors:
            U = f.rmm(U)
        return U

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Product([f.T for f in reversed(self.factors)])

    def _all_square(self):
        return all(f.is_square for f in self.factors)


@closed_forms.solve.register(Product)
def _product_solve(op, b):
    if not op._all_square():
        return NotImplemented
    for f in op.factors:
        b = closed_forms.solve(f, b)
        if b is NotImplemented:
            return NotImplemented
    return b


@closed_forms.inv.register(Product)
def _product_inv(op):
    if not op._all_square():
        return NotImplemented
    return Product([inverse_of(f) for f in reversed(op.factors)])


@closed_forms.logdet.register(Product)
def _product_logdet(op):
    if not op._all_square():
        return NotImplemented
    parts = [closed_forms.logdet(f) for f in op.factors]
    return NotImplemented if any(p is NotImplemented for p in parts) else sum(parts)


@closed_forms.factorize.register(Product)
def _product_factorize(op):
    if not op._all_square():
        return NotImplemented
    return factorize_children(op, op.factors)


class Transpose(LinearOperator):
    """``A^T`` (built by ``A.T`` when ``A`` has no cheaper transpose)."""

    op: LinearOperator
    _levels: int = eqx.field(static=True, repr=False)

    def __init__(self, op: LinearOperator):
        # A transposed leaf counts as a leaf, so that transposing an expression never deepens it.
        levels = nesting_depth(op)
        self._levels = 1 if levels == 1 else composite_levels("Transpose", [levels])
        self.op = op

    @property
    def shape(self):
        return (self.op.shape[1], self.op.shape[0])

    @property
    def dtype(self):
        return self.op.dtype

    @property
    def tags(self):
        return _tags.of_transpose(self.op.tags)

    def children(self):
        return (self.op,)

    def with_children(self, children):
        return Transpose(children[0])

    def signature(self):
        return transpose_signature(self.op)

    def mv(self, v):
        return self.op.rmv(v)

    def mm(self, V):
        return self.op.rmm(V)

    def rmv(self, u):
        return self.op.mv(u)

    def rmm(self, U):
        return self.op.mm(U)

    def transpose(self):
        return self.op


@closed_forms.diag.register(Transpose)
def _transpose_diag(op):
    return closed_forms.diag(op.op)


@closed_forms.solve.register(Transpose)
def _transpose_solve(op, b):
    if _tags.symmetric in op.op.tags:
        return closed_forms.solve(op.op, b)
    factored = closed_forms.factorize(op.op)  # e.g. a dense matrix's LU: solves with its transpose directly
    if factored is not NotImplemented and factored is not op.op:
        return closed_forms.solve(factored.T, b)
    inv = closed_forms.inv(op)
    if inv is NotImplemented:
        return inv
    return inv.mv(b) if b.ndim == 1 else inv.mm(b)


@closed_forms.inv.register(Transpose)
def _transpose_inv(op):
    inv = closed_forms.inv(op.op)
    return inv if inv is NotImplemented else inv.T


@closed_forms.logdet.register(Transpose)
def _transpose_logdet(op):
    return closed_forms.logdet(op.op)


@closed_forms.pinv.register(Transpose)
def _transpose_pinv(op, rtol):
    p = closed_forms.pinv(op.op, rtol)
    return p if p is NotImplemented else p.T


@closed_forms.factorize.register(Transpose)
def _transpose_factorize(op):
    f = closed_forms.factorize(op.op)
    return f if f is NotImplemented else f.T


@closed_forms.hadamard_square.register(Transpose)
def _transpose_hadamard_square(op):
    h = closed_forms.hadamard_square(op.op)
    return h if h is NotImplemented else h.T


@shares_arrays("op", "factored")
class Inverse(LinearOperator):
    r"""The lazy inverse $A^{-1}$ (built by `linops.inv`): each product is a solve.

    Args:
        op: a square operator.
        method: the solve method (``None`` for a closed form, ``"cg"``, ``"dense"``).
        options: keyword options for `linops.solve` (``rtol``, ``maxiter``, ...).
        factored: an operator equal to ``op`` that holds its factorisation (`linops.factorize`); when
            given, every product is a solve with it, and nothing is factorised again.
    """

    op: LinearOperator
    factored: LinearOperator | None
    method: str | None = eqx.field(static=True)
    options: tuple = eqx.field(static=True)
    _levels: int = eqx.field(static=True, repr=False)
    _shared: SharedArrays = eqx.field(static=True, repr=False)

    def __init__(self, op: LinearOperator, method: str | None = None, options: tuple = (), *,
                 factored: LinearOperator | None = None):
        if factored is not None and tuple(factored.shape) != tuple(op.shape):
            raise ValueError(f"Inverse: factored is {describe(factored)} but op is {describe(op)}")
        self._levels = composite_levels("Inverse", [nesting_depth(o) for o in (op, factored) if o is not None])
        self.op = op
        self.factored = factored
        self.method = method
        self.options = tuple(options)
        type(self)._shared.track(self)

    @property
    def shape(self):
        return tuple(self.op.shape)

    @property
    def dtype(self):
        return self.op.dtype

    @property
    def tags(self):
        return _tags.of_inverse(self.op.tags, self.shape)

    def children(self):
        return (self.op,)

    def with_children(self, children):
        same = children[0].signature() == self.op.signature()
        return Inverse(children[0], self.method, self.options, factored=self.factored if same else None)

    def signature(self):
        return ("Inverse", self.op.signature())

    def _solve_with(self, op, b):
        return solve_checked(op, b, self.method, **dict(self.options)).value

    def mv(self, v):
        if self.factored is not None:
            return closed_forms.solve(self.factored, v)
        return self._solve_with(self.op, v)

    mm = mv

    def rmv(self, u):
        if self.factored is not None:
            return closed_forms.solve(self.factored.T, u)
        return self._solve_with(self.op.T, u)

    rmm = rmv

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Inverse(self.op.T, self.method, self.options,
                       factored=None if self.factored is None else self.factored.T)


@closed_forms.solve.register(Inverse)
def _inverse_solve(op, b):
    return op.op.mv(b) if b.ndim == 1 else op.op.mm(b)


@closed_forms.inv.register(Inverse)
def _inverse_inv(op):
    return op.op


@closed_forms.logdet.register(Inverse)
def _inverse_logdet(op):
    ld = closed_forms.logdet(op.op if op.factored is None else op.factored)
    return ld if ld is NotImplemented else -ld


@closed_forms.factorize.register(Inverse)
def _inverse_factorize(op):
    return op if op.factored is not None else NotImplemented


@closed_forms.root.register(Inverse)
def _inverse_root(op):
    r"""From a root $R R^\top = A$: $R^{-\top}$ when $R$ is square, else $A^{-1} R$ (both give $A^{-1}$)."""
    if op.method is not None:
        return NotImplemented
    if op.factored is None:
        explicit = closed_forms.inv(op.op)  # a structured inverse (diagonal, orthonormal low rank + shift) has its own
        if explicit is not NotImplemented and not isinstance(explicit, Inverse) and _tags.psd in explicit.tags:
            r = closed_forms.root(explicit)
            if r is not NotImplemented:
                return r
        s = closed_forms.sqrt(op)
        if s is not NotImplemented:
            return s
    r = closed_forms.root(op.op if op.factored is None else op.factored)
    if r is NotImplemented:
        return r
    if r.is_square:
        rt = r.T
        f = closed_forms.factorize(rt)
        return Inverse(rt, factored=None if f is NotImplemented else f)
    return Product((op, r))


@closed_forms.diag.register(Inverse)
def _inverse_diag(op):
    inv = closed_forms.inv(op.op)
    return NotImplemented if inv is NotImplemented or isinstance(inv, Inverse) else closed_forms.diag(inv)


@closed_forms.sqrt.register(Inverse)
def _inverse_sqrt(op):
    s = closed_forms.sqrt(op.op)
    if s is NotImplemented:
        return s
    f = closed_forms.factorize(s) if op.method is None else NotImplemented
    return Inverse(s, op.method, op.options, factored=None if f is NotImplemented else f)


@closed_forms.eigendecompose.register(Inverse)
def _inverse_eigendecompose(op):
    E = closed_forms.eigendecompose(op.op)
    if E is NotImplemented:
        wq = closed_forms.eigh(op.op)
        if wq is NotImplemented:
            return wq
        E = EigenDecomposed(wq[1], wq[0])
    return closed_forms.inv(E)


def inverse_of(A: LinearOperator, method: str | None = None, options: tuple = ()) -> LinearOperator:
    """`Inverse` of ``A`` holding ``A``'s factorisation when it has one (`linops.inv` without its checks)."""
    if isinstance(A, Inverse):
        return A.op
    factored = closed_forms.factorize(A) if method is None else NotImplemented
    return Inverse(A, method, options, factored=None if factored is NotImplemented else factored)
