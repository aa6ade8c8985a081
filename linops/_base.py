"""The `LinearOperator` base class: shape, dtype, tags, products and the operator syntax."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact

from linops import _tags
from linops._arrays import describe, is_scalar_like  # noqa: F401  (re-exported: defined here before)
from linops.memory import check_dense

_counter = itertools.count()


def new_key() -> int:
    """A fresh stable key for a leaf that holds data.

    Keys are static pytree data: they survive `jax.jit` round trips, so `simplify` can
    recognise that two leaves are the same operator after tracing (Python `is` cannot).
    Give your own operator a static ``uid`` field set from it.

    Examples:
        >>> import linops as lo
        >>> lo.new_key() != lo.new_key()
        True
    """
    return next(_counter)


_COMPOSITES: dict[str, Any] = {}


def register_composites(**constructors) -> None:
    """Called once by `linops._composite`: the classes the operator syntax builds (``A @ B``, ``A + B``,
    ``c * A``, ``A.T``). The base imports no composite, so the algebra has no import cycle."""
    _COMPOSITES.update(constructors)


class LinearOperator(eqx.Module):
    """A lazy linear map ``R^n -> R^m``, an `equinox.Module` pytree.

    Subclasses define `shape`, `dtype` and `mv`; everything else has a default.
    Override `rmv` (transposed product), `mm` (several vectors), `tags` and the
    structure-aware hooks (`_diag`, `_solve`, ...) where a closed form exists.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[2.0, 1.0], [0.0, 3.0]]))
        >>> (A.T @ A + 2.0 * lo.Identity(2)) @ jnp.ones(2)
        Array([ 8., 14.], dtype=float32)
    """

    # --- what a subclass provides -------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        raise NotImplementedError(f"{type(self).__name__} must define `shape`")

    @property
    def dtype(self):
        raise NotImplementedError(f"{type(self).__name__} must define `dtype`")

    @property
    def tags(self) -> frozenset:
        return frozenset()

    def mv(self, v: Inexact[Array, " n"]) -> Inexact[Array, " m"]:
        """Apply the operator to one vector of shape ``(n,)``."""
        raise NotImplementedError(f"{type(self).__name__} must define `mv`")

    def rmv(self, u: jax.Array) -> jax.Array:
        """Apply the transpose to one vector of shape ``(m,)`` (default: a VJP of `mv`)."""
        zeros = jnp.zeros(self.shape[1], self.dtype)
        _, vjp = jax.vjp(self.mv, zeros)
        return vjp(u.astype(self.dtype))[0]

    def mm(self, V: jax.Array) -> jax.Array:
        """Apply the operator to the columns of ``V``, shape ``(n, k)``."""
        return jax.vmap(self.mv, in_axes=1, out_axes=1)(V)

    def rmm(self, U: jax.Array) -> jax.Array:
        return jax.vmap(self.rmv, in_axes=1, out_axes=1)(U)

    def transpose(self) -> LinearOperator:
        if _tags.symmetric in self.tags:  # a tag-driven default: a symmetric operator is its own transpose
            return self
        return _COMPOSITES["Transpose"](self)

    # --- closed forms: return NotImplemented where the structure gives none ---------
    # The defaults here follow from the tags alone (an orthogonal Q has Q^-1 = Q^T and |det Q| = 1; a
    # projector is its own square root and pseudo-inverse); a subclass overrides a hook where its
    # structure gives more, and defers to these (super()) where its tags may say more.

    def _diag(self):
        return NotImplemented

    def _solve(self, b):
        """``A^{-1} b`` for ``b`` of shape ``(n,)`` or ``(n, k)``."""
        if _tags.orthogonal in self.tags and self.is_square:
            return self.rmv(b) if b.ndim == 1 else self.rmm(b)
        return NotImplemented

    def _inv(self):
        """A structured operator equal to ``A^{-1}``."""
        return self.T if _tags.orthogonal in self.tags and self.is_square else NotImplemented

    def _pinv(self, rtol):
        return self if _tags.projector in self.tags else NotImplemented

    def _sqrt(self):
        """The principal (symmetric PSD) square root, as an operator."""
        return self if _tags.projector in self.tags else NotImplemented

    def _logdet(self):
        """``log |det A|``."""
        if _tags.orthogonal in self.tags and self.is_square:
            return jnp.zeros((), self.dtype)
        return NotImplemented

    def _eigh(self):
        """``(eigenvalues ascending, eigenvectors as an orthogonal operator)``."""
        return NotImplemented

    def _trace(self):
        d = self._diag()
        return NotImplemented if d is NotImplemented else jnp.sum(d)

    def _root(self):
        """An operator ``R`` (``(n, r)``) with ``R R^T = A``: by default the principal square root."""
        return self._sqrt()

    def _factorize(self):
        """An operator equal to ``A`` whose solves reuse a factorisation computed here, once."""
        return NotImplemented

    def _eigendecompose(self):
        """``A`` as a `linops.EigenDecomposed` (eigenvalues in any order)."""
        return NotImplemented

    def _eigvalsh(self):
        """The eigenvalues in ascending order (default: those of `_eigh`, else of `_eigendecompose`)."""
        wq = self._eigh()
        if wq is not NotImplemented:
            return wq[0]
        E = self._eigendecompose()
        return NotImplemented if E is NotImplemented else jnp.sort(E.w)

    def _shift(self, lam, nonnegative):
        """A structured operator equal to ``A + lam I`` (used by `linops.shift`), else NotImplemented."""
        return NotImplemented

    def _hadamard_square(self):
        """The operator with every entry squared, ``A o A``, where the structure keeps it."""
        return NotImplemented

    def _woodbury_part(self):
        """What this operator is as a term of a diagonal-plus-low-rank sum (`linops._woodbury`):
        ``("diagonal", d)`` (``d`` a vector or a scalar), ``("lowrank", leaf)`` (a `LowRank`),
        ``("zero",)``; NotImplemented for anything else."""
        return NotImplemented

    # --- structure used by simplify and by the tag rules ---------------------------

    def children(self) -> tuple[LinearOperator, ...]:
        """Operands of a composite; leaves have none."""
        return ()

    def with_children(self, children: tuple[LinearOperator, ...]) -> LinearOperator:
        """The same node over new operands (composites override)."""
        assert not children
        return self

    def signature(self) -> Hashable:
        """A hashable identity: equal signatures mean the same linear map.

        Leaves holding data are identified by their stable key (a static ``uid`` field set
        from `linops.new_key`), composites by their operands' signatures. An operator with
        neither is identified by the Python object: never wrongly equal to another, but
        not recognised after a `jax.jit` round trip (give your operator a ``uid`` for that).
        """
        uid = getattr(self, "uid", None)
        if uid is not None:
            return (type(self).__name__, uid)
        return (type(self).__name__, "object", id(self))

    # --- derived ------------------------------------------------------------------

    @property
    def T(self) -> LinearOperator:
        return self.transpose()

    @property
    def is_square(self) -> bool:
        return self.shape[0] == self.shape[1]

    def as_matrix(self) -> jax.Array:
        """The dense ``(m, n)`` matrix. Always an explicit request: costs ``min(m, n)`` products.

        A wide operator (``m < n``, such as a Jacobian) is read through its transpose, ``m`` products
        with the columns of an ``m x m`` identity, so nothing larger than the result is allocated.
        Raises `linops.memory.MemoryBudgetError` first when the matrix would not fit.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> lo.Dense(jnp.arange(6.0).reshape(2, 3)).as_matrix()
            Array([[0., 1., 2.],
                   [3., 4., 5.]], dtype=float32)
        """
        check_dense(self)
        m, n = self.shape
        if m < n:
            return self.rmm(jnp.eye(m, dtype=self.dtype)).T
        return self.mm(jnp.eye(n, dtype=self.dtype))

    def apply(self, x: Inexact[ArrayLike, " n *k"]) -> Inexact[Array, " m *k"]:
        """``A @ x`` for ``x`` of shape ``(n,)`` or ``(n, k)``, with a checked shape."""
        x = jnp.asarray(x)
        if x.ndim not in (1, 2) or x.shape[0] != self.shape[1]:
            raise ValueError(
                f"{describe(self)} @ x: expected x of shape ({self.shape[1]},) or "
                f"({self.shape[1]}, k), got {tuple(x.shape)}"
            )
        return self.mv(x) if x.ndim == 1 else self.mm(x)

    # --- syntax -------------------------------------------------------------------

    def __matmul__(self, other):
        if isinstance(other, LinearOperator):
            return _COMPOSITES["Product"]((self, other))
        if isinstance(other, (jax.Array, np.ndarray, list, tuple)):
            return self.apply(other)
        return NotImplemented

    def __rmatmul__(self, other):
        if isinstance(other, (jax.Array, np.ndarray, list, tuple)):
            x = jnp.asarray(other)
            if x.ndim == 1:
                return self.T.apply(x)
            if x.ndim == 2:
                return self.T.apply(x.T).T
            raise ValueError(f"x @ {describe(self)}: x must be 1-D or 2-D, got {x.shape}")
        return NotImplemented

    def __add__(self, other):
        if not isinstance(other, LinearOperator):
            return _add_scalar(self, other)
        return _COMPOSITES["Sum"]((self, other))

    def __radd__(self, other):
        return _add_scalar(self, other)

    def __sub__(self, other):
        if not isinstance(other, LinearOperator):
            return NotImplemented
        if tuple(self.shape) != tuple(other.shape):
            raise ValueError(f"Sum: cannot add {describe(self)} and {describe(other)}: shapes differ")
        return _COMPOSITES["Sum"]((self, _COMPOSITES["Scaled"](-1.0, other)))

    def __neg__(self):
        return _COMPOSITES["Scaled"](-1.0, self)

    def __mul__(self, other):
        if not is_scalar_like(other):
            return NotImplemented
        return _COMPOSITES["Scaled"](other, self)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if not is_scalar_like(other):
            return NotImplemented
        return _COMPOSITES["Scaled"](1.0 / other, self)


def _add_scalar(op: LinearOperator, other):
    # A literal 0 is the additive identity, so that `sum(operators)` (which starts from 0) works.
    if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
        return op
    if is_scalar_like(other):
        raise TypeError(f"cannot add the scalar {other!r} to {describe(op)}: an operator plus a scalar is "
                        "ambiguous; write lo.shift(A, lam) for A + lam I")
    return NotImplemented


CLOSED_FORMS = ("_diag", "_solve", "_inv", "_pinv", "_sqrt", "_logdet", "_eigh", "_trace", "_root", "_factorize",
                "_eigendecompose", "_eigvalsh", "_shift", "_hadamard_square", "_woodbury_part")
"""The structure hooks: each returns its closed form or ``NotImplemented`` (a wrapper forwards all of them)."""


def factorize_children(op: LinearOperator, children) -> LinearOperator:
    """``op`` over its children's factorisations (`_factorize`), or NotImplemented when none has one."""
    factored = [c._factorize() for c in children]
    if all(f is NotImplemented for f in factored):
        return NotImplemented
    return op.with_children(tuple(c if f is NotImplemented else f for c, f in zip(children, factored, strict=True)))


def splice(operands: tuple, cls: type, field: str) -> tuple:
    """``operands`` with each one of type ``cls`` replaced by its own operands (its ``field``).

    Keeps an n-ary composite (`Sum`, `Product`) flat however it is built, so a chain of
    ``k`` additions is one node of ``k`` operands, not ``k`` nested nodes that every walk
    would recurse through. The operands are copied in bulk, not one Python step each.
    """
    if not any(type(o) is cls for o in operands):
        return operands
    out: list = []
    for o in operands:
        if type(o) is cls:
            out.extend(getattr(o, field))
        else:
            out.append(o)
    return tuple(out)


def check_square(op: LinearOperator, what: str) -> None:
    if not op.is_square:
        raise ValueError(
            f"{what}: expected a square operator, got {describe(op)}; "
            f"{what} is only defined for square operators"
            + (" (lo.pinv handles rectangular ones)" if what in ("solve", "inv") else "")
        )


def result_dtype(*ops) -> Any:
    return jnp.result_type(*{op.dtype for op in ops})  # a set: a sum of 10,000 terms has a few dtypes


def user_tags(tags, shape) -> frozenset:
    return _tags.close(tags or (), shape)
