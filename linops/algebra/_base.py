"""The `LinearOperator` base class: shape, dtype, tags, products and the operator syntax."""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import describe, is_scalar_like
from linops.memory import check_dense

_COMPOSITES: dict[str, Any] = {}
_COMPILED_LEAVES = 64
"""An operator holding at most this many arrays, applied outside a trace (``A @ x``, ``A.as_matrix()``), runs as
one compiled program per structure, shape and dtype (`_compiled_here`)."""


def _compiled_here(op, *arrays) -> bool:
    """Whether ``op @ x`` (``arrays``: ``x``) or ``op.as_matrix()`` (none) runs as one compiled program.

    Outside a trace, applying an operator expression operation by operation compiles a program per `jax.numpy`
    operation it meets (a reshape, a product, a sum) and per shape; as one program (`equinox.filter_jit`, keyed by
    the operator's structure and shapes, never its identity), a composite such as ``J.T @ D @ J + I`` compiles
    once, and a freshly built operator of the same structure compiles nothing (`benchmarks/eager.py`: 2
    programs for a product and a dense matrix where there were 14 to 52, first calls 0.13-0.67 s against
    0.74-3.2 s, later calls 2-5x faster; the tests of the algebra compile about 1,000 fewer programs). Not
    inside a caller's trace (the caller's program holds the product), nor for an operator of more than
    `_COMPILED_LEAVES` arrays: a product of 1,000 factors compiles for seconds to minutes as one program (issue
    37), while applied operation by operation it reuses one program per operation and shape. Nor for an
    operator that splits its work over the devices of a ``mesh`` (a network operator, a kernel Gram): its
    products compile their own sharded programs, and XLA 0.10.2's SPMD partitioner aborts the process (a failed
    check) on a `lo.HessianOp` on a mesh traced inside a program of one device's arrays.
    """
    leaves = jax.tree_util.tree_leaves(op, is_leaf=_on_a_mesh)
    return (len(leaves) <= _COMPILED_LEAVES and not any(map(_on_a_mesh, leaves))
            and not any(isinstance(x, jax.core.Tracer) for x in (*leaves, *arrays)))


def _on_a_mesh(node) -> bool:
    return not isinstance(node, jax.Array) and getattr(node, "mesh", None) is not None


def _dense(op):
    m, n = op.shape
    if m < n:
        return op.rmm(jnp.eye(m, dtype=op.dtype)).T
    return op.mm(jnp.eye(n, dtype=op.dtype))


def _product(op, x):
    return op.mv(x) if x.ndim == 1 else op.mm(x)


_compiled_dense, _compiled_product = eqx.filter_jit(_dense), eqx.filter_jit(_product)


def data_signature(op) -> Hashable:
    """The signature of a leaf: its pytree structure and the identities of its arrays.

    An operator holding no array (an identity, a zero) is identified by its structure alone.
    """
    leaves, treedef = jax.tree_util.tree_flatten(op)
    return (treedef, tuple(map(id, leaves)))


class SharedArrays:
    """Which array leaves below a composite are one array: static data that survives flattening.

    A composite's pytree structure records the pattern of shared leaves (``J`` twice in ``J^T D J``,
    ``P`` twice in ``P @ P``) as canonical first-appearance numbers, never the arrays' identities:
    two separately built expressions of one structure and one pattern are equal static keys and
    share every compiled program, while ``J^T D J`` and ``K^T D J`` are different keys. Unflattening
    (inside `jax.jit`, `jax.vmap`, `equinox.combine`) makes the shared positions one array again,
    so that signatures, tags (a congruence is PSD) and the rewrite rules still recognise them.

    Computed lazily, on first comparison, from the operands it holds until then (building an
    n-ary composite stays O(n)).
    """

    __slots__ = ("_operands", "_pattern")

    def __init__(self, operands):
        self._operands, self._pattern = operands, None

    @property
    def pattern(self) -> tuple:
        """``(number of leaves, first-appearance index of each leaf or None when all differ)``."""
        if self._operands is not None:
            leaves = jax.tree_util.tree_leaves(self._operands)
            first: dict[int, int] = {}
            indices = tuple(first.setdefault(id(x), i) for i, x in enumerate(leaves))
            distinct = len(first) == len(indices)
            self._pattern = (len(indices), None if distinct else indices)
            self._operands = None
        return self._pattern

    def __eq__(self, other):
        return isinstance(other, SharedArrays) and self.pattern == other.pattern

    def __hash__(self):
        return hash(self.pattern)

    def __repr__(self):
        return f"SharedArrays{self.pattern}"


class _SharedArraysField:
    """The descriptor of a composite's ``_shared`` field: re-shares the operands' leaves on unflatten.

    Equinox unflattens a module by setting its fields, the operands first and the static fields last;
    setting ``_shared`` is where the operands' shared leaves become one object again.
    """

    def __init__(self, fields: tuple[str, ...]):
        self.fields = fields

    def __get__(self, obj, owner=None):
        return self if obj is None else obj.__dict__["_shared"]

    def __set__(self, obj, value):
        obj.__dict__["_shared"] = value
        if not isinstance(value, SharedArrays):
            return
        count, indices = value.pattern
        if indices is None:
            return
        operands = tuple(obj.__dict__.get(f) for f in self.fields)
        leaves, treedef = jax.tree_util.tree_flatten(operands)
        # a partial tree (eqx.partition's halves drop leaves) has nothing to re-share
        if len(leaves) != count or all(leaves[j] is x for x, j in zip(leaves, indices, strict=True)):
            return
        shared = jax.tree_util.tree_unflatten(treedef, [leaves[j] for j in indices])
        for f, v in zip(self.fields, shared, strict=True):
            obj.__dict__[f] = v

    def track(self, obj) -> None:
        """Called at the end of a composite's ``__init__``: record its operands (lazily)."""
        obj.__dict__["_shared"] = SharedArrays(tuple(obj.__dict__.get(f) for f in self.fields))


def shares_arrays(*fields: str):
    """Class decorator of a composite (an operator over operands) with a static ``_shared`` field:
    the operands named by ``fields`` keep their shared leaves through flattening (`SharedArrays`).
    Its ``__init__`` ends with ``type(self)._shared.track(self)``."""

    def decorate(cls):
        cls._shared = _SharedArraysField(fields)
        return cls

    return decorate


def register_composites(**constructors) -> None:
    """Called once by `linops.algebra._composite`: the classes the operator syntax builds (``A @ B``, ``A + B``,
    ``c * A``, ``A.T``). The base imports no composite, so the algebra has no import cycle."""
    _COMPOSITES.update(constructors)


class LinearOperator(eqx.Module):
    """A lazy linear map ``R^n -> R^m``, an `equinox.Module` pytree.

    Subclasses define `shape`, `dtype` and `mv`; everything else has a default.
    Override `rmv` (transposed product), `mm` (several vectors) and `tags`; register closed
    forms (a diagonal, a solve, a log-determinant, ...) with `linops.closed_forms`.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[2.0, 1.0], [0.0, 3.0]]))
        >>> (A.T @ A + 2.0 * lo.Identity(2)) @ jnp.ones(2)
        Array([ 8., 14.], dtype=float32)
    """

    # --- what a subclass provides -------------------------------------------------

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int]:
        """``(m, n)``."""

    @property
    @abc.abstractmethod
    def dtype(self):
        """The dtype of the operator's products."""

    @property
    def tags(self) -> frozenset:
        return frozenset()

    @abc.abstractmethod
    def mv(self, v: Inexact[Array, " n"]) -> Inexact[Array, " m"]:
        """Apply the operator to one vector of shape ``(n,)``."""

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

        A leaf is identified by its tree structure (type, shape, static options) and the
        Python identity of the arrays it holds, composites by their operands' signatures. Two
        operators built on the same arrays are the same map; a freshly built one is another
        map, yet of the same structure, so it reuses every compiled program of its kind (its
        identity is not part of the pytree's static data). Inside `jax.jit` the traced arrays
        identify the leaves: an operator used twice within one argument is recognised (the
        composite records which leaves share arrays, `SharedArrays`), and one passed in as two
        arguments is taken as two operators, which costs a simplification, never a wrong result.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> x = jnp.eye(2)
            >>> lo.Dense(x).signature() == lo.Dense(x).signature()
            True
            >>> lo.Dense(x).signature() == lo.Dense(jnp.eye(2)).signature()
            False
        """
        return data_signature(self)

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
        Raises `linops.memory.MemoryBudgetError` first when the matrix would not fit. Called outside a
        trace, it runs as one compiled program per structure and shape, as ``A @ x`` does.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> lo.Dense(jnp.arange(6.0).reshape(2, 3)).as_matrix()
            Array([[0., 1., 2.],
                   [3., 4., 5.]], dtype=float32)
        """
        check_dense(self)
        return (_compiled_dense if _compiled_here(self) else _dense)(self)

    def apply(self, x: Inexact[ArrayLike, " n *k"]) -> Inexact[Array, " m *k"]:
        """``A @ x`` for ``x`` of shape ``(n,)`` or ``(n, k)``, with a checked shape.

        Called outside a trace, the product runs as one compiled program per operator structure, shape and
        dtype (keyed as `jax.jit` keys an operator: never by its identity), so a composite compiles once
        rather than once per `jax.numpy` operation it meets, and a freshly built operator of the same
        structure compiles nothing. An operator of more than 64 arrays (a product of a thousand factors)
        is applied operation by operation instead, and so is one that splits its work over a device mesh
        (its products compile their own sharded programs); inside a trace, the caller's program holds
        the product.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> J = lo.Dense(jnp.array([[1.0, 2.0], [0.0, 1.0]]))
            >>> (J.T @ lo.Diagonal(jnp.array([1.0, 3.0])) @ J + lo.Identity(2)) @ jnp.ones(2)
            Array([ 4., 10.], dtype=float32)
        """
        x = jnp.asarray(x)
        if x.ndim not in (1, 2) or x.shape[0] != self.shape[1]:
            raise ValueError(
                f"{describe(self)} @ x: expected x of shape ({self.shape[1]},) or "
                f"({self.shape[1]}, k), got {tuple(x.shape)}"
            )
        return (_compiled_product if _compiled_here(self, x) else _product)(self, x)

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


# The closed forms every operator has from its tags alone (an orthogonal Q has Q^-1 = Q^T and |det Q| = 1;
# a projector is its own square root and pseudo-inverse). A class's own rules are tried first
# (`linops.closed_forms`); these answer where they give none.


@closed_forms.solve.register(LinearOperator)
def _linear_operator_solve(op, b):
    """``A^{-1} b`` for ``b`` of shape ``(n,)`` or ``(n, k)``."""
    if _tags.orthogonal in op.tags and op.is_square:
        return op.rmv(b) if b.ndim == 1 else op.rmm(b)
    return NotImplemented


@closed_forms.inv.register(LinearOperator)
def _linear_operator_inv(op):
    """A structured operator equal to ``A^{-1}``."""
    return op.T if _tags.orthogonal in op.tags and op.is_square else NotImplemented


@closed_forms.pinv.register(LinearOperator)
def _linear_operator_pinv(op, rtol):
    return op if _tags.projector in op.tags else NotImplemented


@closed_forms.sqrt.register(LinearOperator)
def _linear_operator_sqrt(op):
    """The principal (symmetric PSD) square root, as an operator."""
    return op if _tags.projector in op.tags else NotImplemented


@closed_forms.logdet.register(LinearOperator)
def _linear_operator_logdet(op):
    """``log |det A|``."""
    if _tags.orthogonal in op.tags and op.is_square:
        return jnp.zeros((), op.dtype)
    return NotImplemented


@closed_forms.trace.register(LinearOperator)
def _linear_operator_trace(op):
    d = closed_forms.diag(op)
    return NotImplemented if d is NotImplemented else jnp.sum(d)


@closed_forms.root.register(LinearOperator)
def _linear_operator_root(op):
    """An operator ``R`` (``(n, r)``) with ``R R^T = A``: by default the principal square root."""
    return closed_forms.sqrt(op)


@closed_forms.eigvalsh.register(LinearOperator)
def _linear_operator_eigvalsh(op):
    """The eigenvalues in ascending order (default: those of `_eigh`, else of `_eigendecompose`)."""
    wq = closed_forms.eigh(op)
    if wq is not NotImplemented:
        return wq[0]
    E = closed_forms.eigendecompose(op)
    return NotImplemented if E is NotImplemented else jnp.sort(E.w)


def _add_scalar(op: LinearOperator, other):
    # A literal 0 is the additive identity, so that `sum(operators)` (which starts from 0) works.
    if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
        return op
    if is_scalar_like(other):
        raise TypeError(f"cannot add the scalar {other!r} to {describe(op)}: an operator plus a scalar is "
                        "ambiguous; write lo.shift(A, lam) for A + lam I")
    return NotImplemented


def factorize_children(op: LinearOperator, children) -> LinearOperator:
    """``op`` over its children's factorisations (`linops.closed_forms.factorize`), or NotImplemented when none
    has one."""
    factored = [closed_forms.factorize(c) for c in children]
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


def check_operator(op, what: str) -> None:
    """``op`` is a `LinearOperator`, else a `TypeError` naming ``what``."""
    if not isinstance(op, LinearOperator):
        raise TypeError(f"{what}: expected a linops.LinearOperator, got {type(op).__name__}")


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
