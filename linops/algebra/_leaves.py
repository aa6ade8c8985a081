"""Basic leaves: `Dense`, `Diagonal`, `Identity`, `Zero` and `FunctionOp`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import (
    as_matrix_array,
    cutoff_inverse,
    default_float,
    describe,
    is_known_nonnegative,
)
from linops.algebra._base import LinearOperator, user_tags
from linops.algebra._eigen import EigenDecomposed
from linops.algebra._factorizations import LU, Cholesky, Triangular
from linops.memory import check_dense


def _columns(b):
    return b if b.ndim == 2 else b[:, None]


class Dense(LinearOperator):
    """A dense matrix as an operator.

    Args:
        matrix: an ``(m, n)`` array.
        tags: structure you promise holds, e.g. ``{"psd"}`` (implied tags are added;
            `linops.testing.assert_tags_hold` checks promises on probes).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[2.0, 0.0], [0.0, 4.0]]), tags={"psd"})
        >>> lo.logdet(A)
        Array(2.0794415, dtype=float32)
    """

    matrix: jax.Array
    declared: frozenset = eqx.field(static=True)

    def __init__(self, matrix, tags: Iterable[str] = ()):
        self.matrix = as_matrix_array(matrix, "Dense", 2)
        self.declared = user_tags(tags, self.matrix.shape)

    @property
    def shape(self):
        return tuple(self.matrix.shape)

    @property
    def dtype(self):
        return self.matrix.dtype

    @property
    def tags(self):
        return self.declared

    def mv(self, v):
        return self.matrix @ v

    def mm(self, V):
        return self.matrix @ V

    def rmv(self, u):
        # Contract axis 0 directly: `matrix.T @ u` compiles to a transpose copy on XLA:CPU (8-20x slower).
        return lax.dot_general(self.matrix, u, (((0,), (0,)), ((), ())))

    rmm = rmv

    def as_matrix(self):
        return self.matrix


@closed_forms.diag.register(Dense)
def _dense_diag(op):
    return jnp.diagonal(op.matrix)


@closed_forms.solve.register(Dense)
def _dense_solve(op, b):
    if _tags.psd in op.declared:
        return jsl.cho_solve(jsl.cho_factor(op.matrix, lower=True), b)
    return jnp.linalg.solve(op.matrix, _columns(b)).reshape(b.shape)


@closed_forms.inv.register(Dense)
def _dense_inv(op):
    return Dense(jnp.linalg.inv(op.matrix), tags=op.declared & _INV_KEEPS)


@closed_forms.logdet.register(Dense)
def _dense_logdet(op):
    if _tags.psd in op.declared:
        L = jnp.linalg.cholesky(op.matrix)
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))
    return jnp.linalg.slogdet(op.matrix)[1]


@closed_forms.pinv.register(Dense)
def _dense_pinv(op, rtol):
    if (tagged := closed_forms.pinv.after(Dense, op, rtol)) is not NotImplemented:  # a projector is its own
        return tagged
    if _tags.symmetric in op.declared:
        w, Q = jnp.linalg.eigh(op.matrix)
        return Dense((Q * cutoff_inverse(w, rtol, op.shape)[None, :]) @ Q.T, tags={"symmetric"})
    U, s, Vt = jnp.linalg.svd(op.matrix, full_matrices=False)
    return Dense((Vt.T * cutoff_inverse(s, rtol, op.shape)[None, :]) @ U.T)


@closed_forms.sqrt.register(Dense)
def _dense_sqrt(op):
    if (tagged := closed_forms.sqrt.after(Dense, op)) is not NotImplemented:  # a projector is its own
        return tagged
    if _tags.psd not in op.declared:
        return NotImplemented
    w, Q = jnp.linalg.eigh(op.matrix)
    return Dense((Q * jnp.sqrt(jnp.clip(w, 0.0))[None, :]) @ Q.T, tags={"psd"})


@closed_forms.eigh.register(Dense)
def _dense_eigh(op):
    if _tags.symmetric not in op.declared:
        return NotImplemented
    w, Q = jnp.linalg.eigh(op.matrix)
    return w, Dense(Q, tags={"orthogonal"})


@closed_forms.svd.register(Dense)
def _dense_svd(op):
    U, s, Vt = jnp.linalg.svd(op.matrix, full_matrices=False)
    return Dense(U), s, Dense(Vt.T)


@closed_forms.eigvalsh.register(Dense)
def _dense_eigvalsh(op):
    return jnp.linalg.eigvalsh(op.matrix) if _tags.symmetric in op.declared else NotImplemented


@closed_forms.eigendecompose.register(Dense)
def _dense_eigendecompose(op):
    wq = closed_forms.eigh(op)
    if wq is NotImplemented:
        return wq
    return EigenDecomposed(wq[1], wq[0], nonnegative=_tags.psd in op.declared or None)


@closed_forms.hadamard_square.register(Dense)
def _dense_hadamard_square(op):
    return Dense(op.matrix**2)


@closed_forms.factorize.register(Dense)
def _dense_factorize(op):
    if _tags.psd in op.declared:
        return Cholesky(Triangular(jnp.linalg.cholesky(op.matrix), lower=True, zero_other_triangle=False))
    return LU(*jsl.lu_factor(op.matrix))


@closed_forms.root.register(Dense)
def _dense_root(op):
    # A Cholesky factor: a fraction of the principal root's cost, and all a sample needs.
    if _tags.psd not in op.declared:
        return NotImplemented
    return Triangular(jnp.linalg.cholesky(op.matrix), lower=True, zero_other_triangle=False)


_INV_KEEPS = frozenset({_tags.symmetric, _tags.psd, _tags.diagonal, _tags.orthogonal})


class Diagonal(LinearOperator):
    """The diagonal matrix ``diag(d)``.

    Args:
        d: the diagonal, shape ``(n,)``.
        nonnegative: declare ``d >= 0`` (so the operator is tagged PSD). By default the
            sign is read from concrete values; a traced ``d`` has no sign to read.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> D = lo.Diagonal(jnp.array([1.0, 4.0]))
        >>> lo.sqrt(D) @ jnp.ones(2)
        Array([1., 2.], dtype=float32)
    """

    d: jax.Array
    nonnegative: bool = eqx.field(static=True)

    def __init__(self, d, *, nonnegative: bool | None = None):
        self.d = as_matrix_array(d, "Diagonal", 1)
        self.nonnegative = is_known_nonnegative(self.d, nonnegative)

    @property
    def shape(self):
        return (self.d.shape[0], self.d.shape[0])

    @property
    def dtype(self):
        return self.d.dtype

    @property
    def tags(self):
        return _tags.close({_tags.diagonal} | ({_tags.psd} if self.nonnegative else set()), self.shape)

    def mv(self, v):
        return self.d * v

    def mm(self, V):
        return self.d[:, None] * V

    rmv = mv
    rmm = mm

    def as_matrix(self):
        check_dense(self)
        return jnp.diag(self.d)


@closed_forms.diag.register(Diagonal)
def _diagonal_diag(op):
    return op.d


@closed_forms.solve.register(Diagonal)
def _diagonal_solve(op, b):
    return b / op.d if b.ndim == 1 else b / op.d[:, None]


@closed_forms.inv.register(Diagonal)
def _diagonal_inv(op):
    return Diagonal(1.0 / op.d, nonnegative=op.nonnegative or None)


@closed_forms.logdet.register(Diagonal)
def _diagonal_logdet(op):
    return jnp.sum(jnp.log(jnp.abs(op.d)))


@closed_forms.pinv.register(Diagonal)
def _diagonal_pinv(op, rtol):
    return Diagonal(cutoff_inverse(op.d, rtol, op.shape), nonnegative=op.nonnegative or None)


@closed_forms.sqrt.register(Diagonal)
def _diagonal_sqrt(op):
    if not op.nonnegative:
        return NotImplemented
    return Diagonal(jnp.sqrt(op.d), nonnegative=True)


@closed_forms.eigendecompose.register(Diagonal)
def _diagonal_eigendecompose(op):
    return EigenDecomposed(Identity(op.shape[0], op.dtype), op.d, nonnegative=op.nonnegative or None)


@closed_forms.woodbury_part.register(Diagonal)
def _diagonal_woodbury_part(op):
    return ("diagonal", op.d)


@closed_forms.hadamard_square.register(Diagonal)
def _diagonal_hadamard_square(op):
    return Diagonal(op.d**2, nonnegative=True)


class Identity(LinearOperator):
    """The ``n x n`` identity.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.Identity(3) @ jnp.arange(3.0)
        Array([0., 1., 2.], dtype=float32)
    """

    n: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)

    def __init__(self, n: int, dtype=None):
        if int(n) < 0:
            raise ValueError(f"Identity: expected a size n >= 0, got {n}")
        self.n = int(n)
        self.dtype_ = np.dtype(default_float() if dtype is None else dtype)

    @property
    def shape(self):
        return (self.n, self.n)

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return _tags.close({_tags.identity}, self.shape)

    def mv(self, v):
        return v

    mm = rmv = rmm = mv

    def signature(self):
        return ("Identity", self.n, str(self.dtype))


@closed_forms.diag.register(Identity)
def _identity_diag(op):
    return jnp.ones(op.n, op.dtype)


@closed_forms.eigendecompose.register(Identity)
def _identity_eigendecompose(op):
    return EigenDecomposed(op, jnp.ones(op.n, op.dtype), nonnegative=True)


@closed_forms.woodbury_part.register(Identity)
def _identity_woodbury_part(op):
    return ("diagonal", 1.0)


@closed_forms.hadamard_square.register(Identity)
def _identity_hadamard_square(op):
    return op


class Zero(LinearOperator):
    """The ``(m, n)`` zero operator.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.Zero(2, 3) @ jnp.ones(3)
        Array([0., 0.], dtype=float32)
    """

    m: int = eqx.field(static=True)
    n: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)

    def __init__(self, m: int, n: int | None = None, dtype=None):
        self.m = int(m)
        self.n = self.m if n is None else int(n)
        self.dtype_ = np.dtype(default_float() if dtype is None else dtype)

    @property
    def shape(self):
        return (self.m, self.n)

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return _tags.close({_tags.zero}, self.shape)

    def mv(self, v):
        return jnp.zeros(self.m, jnp.result_type(self.dtype, v.dtype))

    def mm(self, V):
        return jnp.zeros((self.m, V.shape[1]), jnp.result_type(self.dtype, V.dtype))

    def rmv(self, u):
        return jnp.zeros(self.n, jnp.result_type(self.dtype, u.dtype))

    def rmm(self, U):
        return jnp.zeros((self.n, U.shape[1]), jnp.result_type(self.dtype, U.dtype))

    def transpose(self):
        return Zero(self.n, self.m, self.dtype)

    def signature(self):
        return ("Zero", self.m, self.n, str(self.dtype))


@closed_forms.diag.register(Zero)
def _zero_diag(op):
    return jnp.zeros(min(op.m, op.n), op.dtype)


@closed_forms.pinv.register(Zero)
def _zero_pinv(op, rtol):
    return Zero(op.n, op.m, op.dtype)


@closed_forms.woodbury_part.register(Zero)
def _zero_woodbury_part(op):
    return ("zero",)


@closed_forms.hadamard_square.register(Zero)
def _zero_hadamard_square(op):
    return op


class FunctionOp(LinearOperator):
    """A matrix-free operator from a function ``v -> A v``.

    Args:
        mv: the linear function on vectors of shape ``(n,)``.
        shape: ``(m, n)``.
        dtype: the dtype of the outputs.
        tags: structure you promise holds.
        rmv: the transposed product; by default a VJP of ``mv``.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.FunctionOp(lambda v: 2.0 * v, (3, 3), jnp.float32, tags={"psd"})
        >>> lo.solve(A, jnp.ones(3), method="cg").value.round(4)
        Array([0.5, 0.5, 0.5], dtype=float32)
    """

    fn: Callable = eqx.field(static=True)
    rfn: Callable | None = eqx.field(static=True)
    shape_: tuple = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)
    declared: frozenset = eqx.field(static=True)

    def __init__(self, mv: Callable, shape, dtype, tags: Iterable[str] = (), rmv=None):
        if len(shape) != 2:
            raise ValueError(f"FunctionOp: shape must be (m, n), got {shape}")
        self.fn = mv
        self.rfn = rmv
        self.shape_ = (int(shape[0]), int(shape[1]))
        self.dtype_ = np.dtype(dtype)
        self.declared = user_tags(tags, self.shape_)

    @property
    def shape(self):
        return self.shape_

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return self.declared

    def mv(self, v):
        return self._checked(self.fn(v), self.shape[0], "mv")

    def rmv(self, u):
        if self.rfn is not None:
            return self._checked(self.rfn(u), self.shape[1], "rmv")
        if _tags.symmetric in self.declared:
            return self._checked(self.fn(u), self.shape[1], "mv")
        return super().rmv(u)

    def _checked(self, out, length, which):
        """The function's output, refused (at trace time: shapes are static) unless it has the declared length."""
        if jnp.shape(out) != (length,):
            raise ValueError(f"{describe(self)}: its {which} function returned shape {tuple(jnp.shape(out))} for "
                             f"one vector; the declared shape {self.shape} needs ({length},)")
        return out


def check_vector(op: LinearOperator, b, what: str, length: int) -> jax.Array:
    b = jnp.asarray(b)
    if b.ndim not in (1, 2) or b.shape[0] != length:
        raise ValueError(
            f"{what}: {describe(op)} needs a right-hand side of shape ({length},) or "
            f"({length}, k), got {tuple(b.shape)}"
        )
    return b
