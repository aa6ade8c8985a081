r"""The GGN in each Laplace structure, kept so that the prior precision and the noise can change.

Every structure stores the GGN $G$ (computed once) and gives, for a prior precision $\alpha$
(a scalar or one per parameter) and a GGN scale $s$ (the ratio $\sigma^2/\sigma_0^2$ of a new
Gaussian noise variance to the one $G$ was computed with; 1 otherwise), the posterior
precision $\Lambda = G/s + \operatorname{diag}(\alpha)$: its operator, the covariance
$\Lambda^{-1}$ as an operator, $\log\det\Lambda$ and samples of $\mathcal N(0, \Lambda^{-1})$.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo


def _full_alpha(alpha, n):
    return jnp.broadcast_to(alpha, (n,))


class Structure(eqx.Module):
    """Base: a GGN in structured form. Subclasses implement the methods below."""

    def factorize(self, alpha, scale):
        """What products and samples at this ``(alpha, scale)`` reuse (e.g. a Cholesky factor)."""
        return None

    def precision(self, alpha, scale) -> lo.LinearOperator:
        raise NotImplementedError

    def covariance(self, alpha, scale, factor) -> lo.LinearOperator:
        raise NotImplementedError

    def logdet(self, alpha, scale) -> jax.Array:
        raise NotImplementedError

    def sample(self, key, n, alpha, scale, factor) -> jax.Array:
        """``(P, n)`` draws of $\\mathcal N(0, \\Lambda^{-1})$."""
        raise NotImplementedError

    def logdet_fn(self, scalar_alpha: bool):
        """A function ``(alpha, scale) -> logdet`` for many evaluations (tuning)."""
        return self.logdet

    def quadratic_rows(self, J, alpha, scale, factor) -> jax.Array | None:
        r"""$\operatorname{diag}(J \Lambda^{-1} J^\top)$ for rows ``J`` ``(R, P)`` where the structure has a more
        accurate form than ``J`` times the covariance's product; None (the default) where it has none."""
        return None


class Full(Structure):
    """The dense GGN: Cholesky of $\\Lambda$; for a scalar prior, its eigenvalues for cheap tuning."""

    G: jax.Array

    def _Lambda(self, alpha, scale):
        return self.G / scale + jnp.diag(_full_alpha(alpha, self.G.shape[0]).astype(self.G.dtype))

    def factorize(self, alpha, scale):
        L = jnp.linalg.cholesky(self._Lambda(alpha, scale))
        eye = jnp.eye(L.shape[0], dtype=L.dtype)
        Sigma = jax.scipy.linalg.cho_solve((L, True), eye)
        return L, (Sigma + Sigma.T) / 2

    def precision(self, alpha, scale):
        return lo.Dense(self._Lambda(alpha, scale), tags={"psd"})

    def covariance(self, alpha, scale, factor):
        return lo.Dense(factor[1], tags={"psd"})

    def logdet(self, alpha, scale):
        return 2.0 * jnp.sum(jnp.log(jnp.diag(jnp.linalg.cholesky(self._Lambda(alpha, scale)))))

    def sample(self, key, n, alpha, scale, factor):
        L = factor[0]
        z = jax.random.normal(key, (L.shape[0], n), L.dtype)
        return jax.scipy.linalg.solve_triangular(L.T, z, lower=False)  # covariance L^-T L^-1 = Lambda^-1

    def logdet_fn(self, scalar_alpha):
        if not scalar_alpha:
            return self.logdet
        w = jnp.clip(jnp.linalg.eigvalsh(self.G), 0.0)  # once: then O(P) per evaluation
        return lambda alpha, scale: jnp.sum(jnp.log(w / scale + alpha))


class Diag(Structure):
    """The exact diagonal of the GGN."""

    g: jax.Array

    def _diag(self, alpha, scale):
        return self.g / scale + alpha

    def precision(self, alpha, scale):
        return lo.Diagonal(self._diag(alpha, scale), nonnegative=True)

    def covariance(self, alpha, scale, factor):
        return lo.Diagonal(1.0 / self._diag(alpha, scale), nonnegative=True)

    def logdet(self, alpha, scale):
        return jnp.sum(jnp.log(self._diag(alpha, scale)))

    def sample(self, key, n, alpha, scale, factor):
        z = jax.random.normal(key, (self.g.shape[0], n), self.g.dtype)
        return z / jnp.sqrt(self._diag(alpha, scale))[:, None]


class LowRank(Structure):
    """Top GGN eigenpairs $U \\operatorname{diag}(\\lambda) U^\\top$ (orthonormal $U$): Woodbury, never ``P x P``."""

    U: jax.Array
    lam: jax.Array

    def precision(self, alpha, scale):
        P = self.U.shape[0]
        prior = alpha * lo.Identity(P, self.U.dtype) if jnp.ndim(alpha) == 0 else lo.Diagonal(alpha)
        return lo.LowRank(self.U, jnp.clip(self.lam, 0.0) / scale, orthonormal=True, nonnegative=True) + prior

    def covariance(self, alpha, scale, factor):
        lam = jnp.clip(self.lam, 0.0) / scale
        if jnp.ndim(alpha) == 0:  # (lam + a)^-1 on span U, 1/a elsewhere: an explicit low-rank form
            inner = lo.LowRank(self.U, 1.0 / (lam + alpha) - 1.0 / alpha, orthonormal=True)
            return lo.shift(inner, 1.0 / alpha, nonnegative=True)
        return lo.inv(self.precision(alpha, scale))  # Woodbury at every product

    def quadratic_rows(self, J, alpha, scale, factor):
        r"""$\Lambda^{-1} = (I - UU^\top)/\alpha + U(\lambda + \alpha)^{-1}U^\top$, a sum of PSD terms.

        The covariance's product form $I/\alpha + U[(\lambda+\alpha)^{-1} - \alpha^{-1}]U^\top$ subtracts nearly
        equal numbers where the posterior variance is far below the prior's, and loses the variance to
        round-off in float32; here both terms are sums of squares.
        """
        if jnp.ndim(alpha) != 0:
            return None
        lam = jnp.clip(self.lam, 0.0) / scale
        C = J @ self.U  # (R, k)
        residual = J - C @ self.U.T  # the rows' part outside span U
        return jnp.sum(residual**2, axis=1) / alpha + jnp.sum(C**2 / (lam + alpha)[None, :], axis=1)

    def logdet(self, alpha, scale):
        lam = jnp.clip(self.lam, 0.0) / scale
        if jnp.ndim(alpha) == 0:
            P, k = self.U.shape
            return jnp.sum(jnp.log(lam + alpha)) + (P - k) * jnp.log(alpha)
        return lo.logdet(self.precision(alpha, scale))

    def sample(self, key, n, alpha, scale, factor):
        P, k = self.U.shape
        lam = jnp.clip(self.lam, 0.0) / scale
        k1, k2 = jax.random.split(key)
        z = jax.random.normal(k1, (P, n), self.U.dtype)
        if jnp.ndim(alpha) == 0:  # the principal square root of the covariance
            root = 1.0 / jnp.sqrt(lam + alpha) - 1.0 / jnp.sqrt(alpha)
            return z / jnp.sqrt(alpha) + self.U @ (root[:, None] * (self.U.T @ z))
        # Lambda = D + U L U^T = R R^T with R = [D^1/2, U L^1/2]; Lambda^-1 R z ~ N(0, Lambda^-1)
        z2 = jax.random.normal(k2, (k, n), self.U.dtype)
        rhs = jnp.sqrt(alpha)[:, None] * z + self.U @ (jnp.sqrt(lam)[:, None] * z2)
        return lo.solve(self.precision(alpha, scale), rhs).value


class KFAC(Structure):
    """Per leaf: eigendecompositions of the Kronecker factors (weights), of the exact bias block,
    or the exact diagonal (leaves outside any dense layer). One prior precision per leaf."""

    kinds: tuple = eqx.field(static=True)  # per leaf: "kron", "dense" or "diag"
    blocks: tuple  # per leaf: (Q1, w1, Q2, w2) | (Q, w) | (g,)
    sizes: tuple = eqx.field(static=True)

    def _eigs(self, i, alpha_i, scale):
        kind, b = self.kinds[i], self.blocks[i]
        if kind == "kron":
            return jnp.kron(b[1], b[3]) / scale + alpha_i
        if kind == "dense":
            return b[1] / scale + alpha_i
        return b[0] / scale + alpha_i

    def _Q(self, i):
        kind, b = self.kinds[i], self.blocks[i]
        if kind == "kron":
            return lo.Kronecker(lo.Dense(b[0], tags={"orthogonal"}), lo.Dense(b[2], tags={"orthogonal"}))
        if kind == "dense":
            return lo.Dense(b[0], tags={"orthogonal"})
        return None

    def _leaf_alpha(self, alpha):
        if jnp.ndim(alpha) == 0:
            return [alpha] * len(self.sizes)
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        return [alpha[s] for s in starts]  # constant per leaf (checked on construction)

    def _block_op(self, i, values):
        Q = self._Q(i)
        D = lo.Diagonal(values, nonnegative=True)
        return D if Q is None else Q @ D @ Q.T

    def precision(self, alpha, scale):
        a = self._leaf_alpha(alpha)
        return lo.BlockDiagonal([self._block_op(i, self._eigs(i, a[i], scale)) for i in range(len(self.sizes))])

    def covariance(self, alpha, scale, factor):
        a = self._leaf_alpha(alpha)
        return lo.BlockDiagonal([self._block_op(i, 1.0 / self._eigs(i, a[i], scale)) for i in range(len(self.sizes))])

    def logdet(self, alpha, scale):
        a = self._leaf_alpha(alpha)
        return sum(jnp.sum(jnp.log(self._eigs(i, a[i], scale))) for i in range(len(self.sizes)))

    def sample(self, key, n, alpha, scale, factor):
        a = self._leaf_alpha(alpha)
        keys = jax.random.split(key, len(self.sizes))
        parts = []
        for i in range(len(self.sizes)):
            ev = self._eigs(i, a[i], scale)
            z = jax.random.normal(keys[i], (self.sizes[i], n), ev.dtype) / jnp.sqrt(ev)[:, None]
            Q = self._Q(i)
            parts.append(z if Q is None else Q @ z)
        return jnp.concatenate(parts, axis=0)


__all__ = ["Diag", "Full", "KFAC", "LowRank", "Structure"]
