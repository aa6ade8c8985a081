r"""`Circulant`: a matrix whose columns are the cyclic shifts of one, applied and solved by the FFT.

A circulant $C$ with first column $c$ is diagonalised by the discrete Fourier transform,
$C = F^{-1}\operatorname{diag}(\hat c) F$ with $\hat c = F c$, so products, solves, the
log-determinant, the inverse and the square root all cost $O(n \log n)$ and nothing $n \times n$
is formed. A stationary kernel on a regular periodic grid (a covariance that depends on
$(i - j) \bmod n$ only) is one.
"""

from __future__ import annotations

from collections.abc import Iterable

import equinox as eqx
import jax
import jax.numpy as jnp

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import as_matrix_array
from linops.algebra._base import LinearOperator, user_tags

_KEEPS = frozenset({_tags.symmetric, _tags.psd})  # what the inverse, the square root and a nonnegative shift keep


class Circulant(LinearOperator):
    r"""The $n \times n$ circulant matrix with first column ``c``: $C_{ij} = c_{(i - j) \bmod n}$.

    Applied by the FFT in $O(n \log n)$. Closed forms (`linops.closed_forms`): the diagonal
    ($c_0$), solves, the inverse (a circulant), the log-determinant ($\sum_k \log\lvert\hat c_k\rvert$),
    the shift by $\lambda I$ and the entrywise square (both circulants); the square root and the
    ascending eigenvalues ($\hat c$, real) when the tags say it is PSD or symmetric.

    Args:
        c: the first column, shape ``(n,)``.
        tags: declared properties (``"symmetric"`` when $c_k = c_{n-k}$, ``"psd"`` when moreover
            every $\hat c_k \ge 0$); like `linops.Dense`'s, they are trusted, not checked.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> C = lo.Circulant(jnp.array([2.0, 1.0, 0.0, 1.0]), tags={"psd"})
        >>> C.as_matrix()
        Array([[2., 1., 0., 1.],
               [1., 2., 1., 0.],
               [0., 1., 2., 1.],
               [1., 0., 1., 2.]], dtype=float32)
        >>> lo.eigvalsh(C)
        Array([0., 2., 2., 4.], dtype=float32)
        >>> lo.solve(lo.shift(C, 1.0), jnp.ones(4)).value
        Array([0.2, 0.2, 0.2, 0.2], dtype=float32)
    """

    c: jax.Array
    declared: frozenset = eqx.field(static=True)

    def __init__(self, c, tags: Iterable[str] = ()):
        self.c = as_matrix_array(c, "Circulant", 1)
        self.declared = user_tags(tags, (self.c.shape[0], self.c.shape[0]))

    @property
    def shape(self):
        return (self.c.shape[0], self.c.shape[0])

    @property
    def dtype(self):
        return self.c.dtype

    @property
    def tags(self):
        return self.declared

    @property
    def spectrum(self) -> jax.Array:
        r"""The eigenvalues $\hat c = F c$ (complex), in the DFT's order."""
        return jnp.fft.fft(self.c)

    def _apply(self, spectrum, V):
        return jnp.fft.ifft(spectrum.reshape((-1,) + (1,) * (V.ndim - 1)) * jnp.fft.fft(V, axis=0), axis=0).real \
            .astype(self.dtype)

    def mv(self, v):
        return self._apply(self.spectrum, v)

    mm = mv

    def rmv(self, u):
        return self._apply(jnp.conj(self.spectrum), u)

    rmm = rmv

    def transpose(self):
        if _tags.symmetric in self.tags:
            return self
        return Circulant(jnp.roll(self.c[::-1], 1), tags=self.declared)


@closed_forms.diag.register(Circulant)
def _circulant_diag(op):
    return jnp.full(op.shape[0], op.c[0], op.dtype)


@closed_forms.solve.register(Circulant)
def _circulant_solve(op, b):
    return op._apply(1.0 / op.spectrum, b)


@closed_forms.inv.register(Circulant)
def _circulant_inv(op):
    return Circulant(jnp.fft.ifft(1.0 / op.spectrum).real.astype(op.dtype), tags=op.declared & _KEEPS)


@closed_forms.logdet.register(Circulant)
def _circulant_logdet(op):
    return jnp.sum(jnp.log(jnp.abs(op.spectrum))).astype(op.dtype)


@closed_forms.sqrt.register(Circulant)
def _circulant_sqrt(op):
    if _tags.psd not in op.tags:
        return NotImplemented
    root = jnp.fft.ifft(jnp.sqrt(jnp.clip(op.spectrum.real, 0.0))).real.astype(op.dtype)
    return Circulant(root, tags={_tags.psd})


@closed_forms.eigvalsh.register(Circulant)
def _circulant_eigvalsh(op):
    if _tags.symmetric not in op.tags:
        return NotImplemented
    return jnp.sort(op.spectrum.real).astype(op.dtype)


@closed_forms.shift.register(Circulant)
def _circulant_shift(op, lam, nonnegative):
    keeps = _KEEPS if nonnegative else frozenset({_tags.symmetric})
    return Circulant(op.c.at[0].add(jnp.asarray(lam, op.dtype)), tags=op.declared & keeps)


@closed_forms.hadamard_square.register(Circulant)
def _circulant_hadamard_square(op):
    return Circulant(op.c * op.c, tags=op.declared & _KEEPS)  # Schur: the square of a PSD matrix is PSD
