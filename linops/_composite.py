"""Composites: `Sum`, `Product`, `Scaled`, `Transpose`, `Inverse`, and `shift`.

Construction checks shapes and computes tags; it never simplifies (`linops.simplify` does).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops import _tags
from linops._base import LinearOperator, describe, is_scalar_like, result_dtype


def transpose_signature(op: LinearOperator):
    """The signature of ``op.T`` without building it."""
    if _tags.symmetric in op.tags:
        return op.signature()
    if isinstance(op, Transpose):
        return op.op.signature()
    return ("Transpose", op.signature())


class Sum(LinearOperator):
    """``A_1 + A_2 + ...`` (built by ``A + B``)."""

    terms: tuple

    def __init__(self, terms: Sequence[LinearOperator]):
        terms = tuple(terms)
        if not terms:
            raise ValueError("Sum: expected at least one operator")
        for t in terms[1:]:
            if tuple(t.shape) != tuple(terms[0].shape):
                raise ValueError(
                    f"Sum: cannot add {describe(terms[0])} and {describe(t)}: shapes differ"
                )
        self.terms = terms

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
        from linops import _woodbury

        return _woodbury.solve(self, b)

    def _logdet(self):
        from linops import _woodbury

        return _woodbury.logdet(self)

    def _inv(self):
        from linops import _woodbury

        return _woodbury.inv(self)

    def _sqrt(self):
        from linops import _woodbury

        return _woodbury.sqrt(self)

    def _root(self):
        from linops import _woodbury

        return _woodbury.root(self)


class Product(LinearOperator):
    """``A_1 A_2 ... A_k`` (built by ``A @ B``); applied right to left."""

    factors: tuple

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
        self.factors = factors

    @property
    def shape(self):
        return (self.factors[0].shape[0], self.factors[-1].shape[1])

    @property
    def dtype(self):
        return result_dtype(*self.factors)

    def flat_factors(self) -> tuple:
        """The factors with nested products expanded (``(AB)C`` reads ``A, B, C``)."""
        out = []
        for f in self.factors:
            out.extend(f.flat_factors() if isinstance(f, Product) else (f,))
        return tuple(out)

    @property
    def tags(self):
        fs = self.flat_factors()
        k = len(fs)
        pairs_match = k >= 2 and all(
            transpose_signature(fs[i]) == fs[k - 1 - i].signature() for i in range(k // 2)
        )
        middle = fs[k // 2].tags if (pairs_match and k % 2 == 1) else None
        sigs = {f.signature() for f in fs}
        idempotent = len(sigs) == 1 and _tags.projector in fs[0].tags
        return _tags.of_product(
            [f.tags for f in fs],
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
        for f in reversed(self.factors):
            v = f.mv(v)
        return v

    def mm(self, V):
        for f in reversed(self.factors):
            V = f.mm(V)
        return V

    def rmv(self, u):
        for f in self.factors:
            u = f.rmv(u)
        return u

    def rmm(self, U):
        for f in self.factors:
            U = f.rmm(U)
        return U

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Product([f.T for f in reversed(self.factors)])

    def _all_square(self):
        return all(f.is_square for f in self.factors)

    def _solve(self, b):
        if not self._all_square():
            return NotImplemented
        for f in self.factors:
            b = f._solve(b)
            if b is NotImplemented:
                return NotImplemented
        return b

    def _inv(self):
        if not self._all_square():
            return NotImplemented
        from linops._functions import inv

        return Product([inv(f) for f in reversed(self.factors)])

    def _logdet(self):
        if not self._all_square():
            return NotImplemented
        parts = [f._logdet() for f in self.factors]
        return NotImplemented if any(p is NotImplemented for p in parts) else sum(parts)

    def _factorize(self):
        if not self._all_square():
            return NotImplemented
        return factorize_children(self, self.factors)


def _scalar_uid(c):
    if isinstance(c, (int, float, np.number)):
        return ("const", float(c))
    return None


class Scaled(LinearOperator):
    """``c A`` for a scalar ``c`` (built by ``c * A``).

    Args:
        scalar: a Python number or 0-d array (may be traced).
        op: the operator.
        nonnegative: declare ``c >= 0`` so that a PSD ``A`` stays PSD; a concrete ``c``
            has its sign read, a traced one has none to read.
    """

    scalar: jax.Array
    op: LinearOperator
    nonnegative: bool = eqx.field(static=True)
    is_one: bool = eqx.field(static=True)
    uid: object = eqx.field(static=True)

    def __init__(self, scalar, op: LinearOperator, *, nonnegative: bool | None = None, uid=None):
        if not is_scalar_like(scalar):
            raise ValueError(f"Scaled: expected a scalar, got {describe(scalar)}")
        if not isinstance(op, LinearOperator):
            raise TypeError(f"Scaled: expected a LinearOperator, got {type(op).__name__}")
        from linops._base import new_key
        from linops._leaves import is_known_nonnegative

        self.uid = uid if uid is not None else (_scalar_uid(scalar) or new_key())
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
        return Scaled(self.scalar, children[0], nonnegative=self.nonnegative or None, uid=self.uid)

    def signature(self):
        return ("Scaled", self.uid, self.op.signature())

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
        from linops._functions import inv

        return Scaled(1.0 / self.scalar, inv(self.op), nonnegative=self.nonnegative or None,
                      uid=("inverse", self.uid))

    def _logdet(self):
        ld = self.op._logdet()
        if ld is NotImplemented:
            return ld
        return ld + self.shape[0] * jnp.log(jnp.abs(self.scalar))

    def _pinv(self, rtol):
        p = self.op._pinv(rtol)
        return p if p is NotImplemented else Scaled(1.0 / self.scalar, p, nonnegative=self.nonnegative or None,
                                                    uid=("inverse", self.uid))

    def _sqrt(self):
        if not self.nonnegative:
            return NotImplemented
        s = self.op._sqrt()
        return s if s is NotImplemented else Scaled(jnp.sqrt(self.scalar), s, nonnegative=True,
                                                    uid=("sqrt", self.uid))

    def _eigh(self):
        if not self.nonnegative:
            return NotImplemented
        wq = self.op._eigh()
        return wq if wq is NotImplemented else (self.scalar * wq[0], wq[1])

    def _root(self):
        if not self.nonnegative:
            return NotImplemented
        r = self.op._root()
        return r if r is NotImplemented else Scaled(jnp.sqrt(self.scalar), r, nonnegative=True, uid=("root", self.uid))

    def _factorize(self):
        return factorize_children(self, (self.op,))


class Transpose(LinearOperator):
    """``A^T`` (built by ``A.T`` when ``A`` has no cheaper transpose)."""

    op: LinearOperator

    def __init__(self, op: LinearOperator):
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

    def _diag(self):
        return self.op._diag()

    def _solve(self, b):
        from linops._leaves import Dense

        if _tags.symmetric in self.op.tags:
            return self.op._solve(b)
        if isinstance(self.op, Dense):
            return Dense(self.op.matrix.T, tags=self.op.tags)._solve(b)
        inv = self._inv()
        if inv is NotImplemented:
            return inv
        return inv.mv(b) if b.ndim == 1 else inv.mm(b)

    def _inv(self):
        inv = self.op._inv()
        return inv if inv is NotImplemented else inv.T

    def _logdet(self):
        return self.op._logdet()

    def _pinv(self, rtol):
        p = self.op._pinv(rtol)
        return p if p is NotImplemented else p.T

    def _factorize(self):
        f = self.op._factorize()
        return f if f is NotImplemented else f.T

    def _hadamard_square(self):
        h = self.op._hadamard_square()
        return h if h is NotImplemented else h.T


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

    def __init__(self, op: LinearOperator, method: str | None = None, options: tuple = (), *,
                 factored: LinearOperator | None = None):
        if factored is not None and tuple(factored.shape) != tuple(op.shape):
            raise ValueError(f"Inverse: factored is {describe(factored)} but op is {describe(op)}")
        self.op = op
        self.factored = factored
        self.method = method
        self.options = tuple(options)

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
        from linops._functions import solve

        return solve(op, b, method=self.method, **dict(self.options)).value

    def mv(self, v):
        if self.factored is not None:
            return self.factored._solve(v)
        return self._solve_with(self.op, v)

    mm = mv

    def rmv(self, u):
        if self.factored is not None:
            return self.factored.T._solve(u)
        return self._solve_with(self.op.T, u)

    rmm = rmv

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Inverse(self.op.T, self.method, self.options,
                       factored=None if self.factored is None else self.factored.T)

    def _solve(self, b):
        return self.op.mv(b) if b.ndim == 1 else self.op.mm(b)

    def _inv(self):
        return self.op

    def _logdet(self):
        ld = (self.op if self.factored is None else self.factored)._logdet()
        return ld if ld is NotImplemented else -ld

    def _factorize(self):
        return self if self.factored is not None else NotImplemented

    def _root(self):
        r"""From a root $R R^\top = A$: $R^{-\top}$ when $R$ is square, else $A^{-1} R$ (both give $A^{-1}$)."""
        if self.method is not None:
            return NotImplemented
        if self.factored is None:
            explicit = self.op._inv()  # a structured inverse (diagonal, orthonormal low rank + shift) has its own
            if explicit is not NotImplemented and not isinstance(explicit, Inverse) and _tags.psd in explicit.tags:
                r = explicit._root()
                if r is not NotImplemented:
                    return r
            s = self._sqrt()
            if s is not NotImplemented:
                return s
        r = (self.op if self.factored is None else self.factored)._root()
        if r is NotImplemented:
            return r
        if r.is_square:
            rt = r.T
            f = rt._factorize()
            return Inverse(rt, factored=None if f is NotImplemented else f)
        return Product((self, r))

    def _diag(self):
        inv = self.op._inv()
        return NotImplemented if inv is NotImplemented or isinstance(inv, Inverse) else inv._diag()

    def _sqrt(self):
        s = self.op._sqrt()
        if s is NotImplemented:
            return s
        f = s._factorize() if self.method is None else NotImplemented
        return Inverse(s, self.method, self.options, factored=None if f is NotImplemented else f)

    def _eigh(self):
        wq = self.op._eigh()
        if wq is NotImplemented:
            return wq
        w, Q = wq
        from linops._structured import Selection

        n = w.shape[0]
        reverse = Selection(jnp.arange(n - 1, -1, -1), n, is_permutation=True).T
        return (1.0 / w)[::-1], Q @ reverse


def shift(A: LinearOperator, lam, *, nonnegative: bool | None = None) -> LinearOperator:
    r"""$A + \lambda I$, with the sign of $\lambda$ declared so PSD-ness is kept under tracing.

    A traced $\lambda$ has no sign to inspect, so ``shift(G, lam, nonnegative=True)`` is how
    a PSD curvature plus a prior precision stays tagged PSD inside `jax.jit`.

    Example:
        >>> import jax.numpy as jnp, linops as lo
        >>> G = lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"psd"})
        >>> "psd" in lo.shift(G, 0.5).tags
        True
    """
    from linops._leaves import Identity

    if not A.is_square:
        raise ValueError(f"shift: expected a square operator, got {describe(A)}")
    from linops._leaves import is_known_nonnegative

    structured = A._shift(lam, is_known_nonnegative(lam, nonnegative))
    if structured is not NotImplemented:  # e.g. an eigen-decomposed operator: its eigenvalues move
        return structured
    return Sum((A, Scaled(lam, Identity(A.shape[0], A.dtype), nonnegative=nonnegative)))


def factorize_children(op: LinearOperator, children) -> LinearOperator:
    """``op`` over its children's factorisations, or NotImplemented when none of them has one."""
    factored = [c._factorize() for c in children]
    if all(f is NotImplemented for f in factored):
        return NotImplemented
    new = tuple(c if f is NotImplemented else f for c, f in zip(children, factored, strict=True))
    return op.with_children(new)
