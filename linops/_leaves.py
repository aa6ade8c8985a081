"""Basic leaves: `Dense`, `Diagonal`, `Identity`, `Zero` and `FunctionOp`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

from linops import _tags
from linops._arrays import (
    as_matrix_array,
    cutoff_inverse,
    default_float,
    describe,
    is_known_nonnegative,
)
from linops._base import LinearOperator, user_tags
from linops._eigen import EigenDecomposed
from linops._factorizations import LU, Cholesky, Triangular
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

    def _diag(self):
        return jnp.diagonal(self.matrix)

    def _solve(self, b):
        if _tags.psd in self.declared:
            return jsl.cho_solve(jsl.cho_factor(self.matrix, lower=True), b)
        return jnp.linalg.solve(self.matrix, _columns(b)).reshape(b.shape)

    def _inv(self):
        return Dense(jnp.linalg.inv(self.matrix), tags=self.declared & _INV_KEEPS)

    def _logdet(self):
        if _tags.psd in self.declared:
            L = jnp.linalg.cholesky(self.matrix)
            return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))
        return jnp.linalg.slogdet(self.matrix)[1]

    def _pinv(self, rtol):
        if (tagged := super()._pinv(rtol)) is not NotImplemented:  # a projector is its own
            return tagged
        if _tags.symmetric in self.declared:
            w, Q = jnp.linalg.eigh(self.matrix)
            return Dense((Q * cutoff_inverse(w, rtol, self.shape)[None, :]) @ Q.T, tags={"symmetric"})
        U, s, Vt = jnp.linalg.svd(self.matrix, full_matrices=False)
        return Dense((Vt.T * cutoff_inverse(s, rtol, self.shape)[None, :]) @ U.T)

    def _sqrt(self):
        if (tagged := super()._sqrt()) is not NotImplemented:  # a projector is its own
            return tagged
        if _tags.psd not in self.declared:
            return NotImplemented
        w, Q = jnp.linalg.eigh(self.matrix)
        return Dense((Q * jnp.sqrt(jnp.clip(w, 0.0))[None, :]) @ Q.T, tags={"psd"})

    def _eigh(self):
        if _tags.symmetric not in self.declared:
            return NotImplemented
        w, Q = jnp.linalg.eigh(self.matrix)
        return w, Dense(Q, tags={"orthogonal"})

    def _eigvalsh(self):
        return jnp.linalg.eigvalsh(self.matrix) if _tags.symmetric in self.declared else NotImplemented

    def _eigendecompose(self):
        wq = self._eigh()
        if wq is NotImplemented:
            return wq
        return EigenDecomposed(wq[1], wq[0], nonnegative=_tags.psd in self.declared or None)

    def _hadamard_square(self):
        return Dense(self.matrix**2)

    def _factorize(self):
        if _tags.psd in self.declared:
            return Cholesky(Triangular(jnp.linalg.cholesky(self.matrix), lower=True, zero_other_triangle=False))
        return LU(*jsl.lu_factor(self.matrix))

    def _root(self):
        # A Cholesky factor: a fraction of the principal root's cost, and all a sample needs.
        if _tags.psd not in self.declared:
            return NotImplemented
        return Triangular(jnp.linalg.cholesky(self.matrix), lower=True, zero_other_triangle=False)


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

    def _diag(self):
        return self.d

    def _solve(self, b):
        return b / self.d if b.ndim == 1 else b / self.d[:, None]

    def _inv(self):
        return Diagonal(1.0 / self.d, nonnegative=self.nonnegative or None)

    def _logdet(self):
        return jnp.sum(jnp.log(jnp.abs(self.d)))

    def _pinv(self, rtol):
        return Diagonal(cutoff_inverse(self.d, rtol, self.shape), nonnegative=self.nonnegative or None)

    def _sqrt(self):
        if not self.nonnegative:
            return NotImplemented
        return Diagonal(jnp.sqrt(self.d), nonnegative=True)

    def _eigendecompose(self):
        return EigenDecomposed(Identity(self.shape[0], self.dtype), self.d, nonnegative=self.nonnegative or None)

    def _woodbury_part(self):
        return ("diagonal", self.d)

    def _hadamard_square(self):
        return Diagonal(self.d**2, nonnegative=True)


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

    def _diag(self):
        return jnp.ones(self.n, self.dtype)

    def _eigendecompose(self):
        return EigenDecomposed(self, jnp.ones(self.n, self.dtype), nonnegative=True)

    def _woodbury_part(self):
        return ("diagonal", 1.0)

    def _hadamard_square(self):
        return self


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

    def _diag(self):
        return jnp.zeros(min(self.m, self.n), self.dtype)

    def _pinv(self, rtol):
        return Zero(self.n, self.m, self.dtype)

    def _woodbury_part(self):
        return ("zero",)

    def _hadamard_square(self):
        return self


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
        return self.fn(v)

    def rmv(self, u):
        if self.rfn is not None:
            return self.rfn(u)
        if _tags.symmetric in self.declared:
            return self.fn(u)
        return super().rmv(u)


def check_vector(op: LinearOperator, b, what: str, length: int) -> jax.Array:
    b = jnp.asarray(b)
    if b.ndim not in (1, 2) or b.shape[0] != length:
        raise ValueError(
            f"{what}: {describe(op)} needs a right-hand side of shape ({length},) or "
            f"({length}, k), got {tuple(b.shape)}"
        )
    return b
