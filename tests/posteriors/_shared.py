"""What the posteriors' tests share: the Laplace kinds they sweep (as `posteriors.laplace`'s two axes), the dense
GGN of any model (the reference every structure is checked against) and the Bayesian-linear-regression oracle,
where every Laplace quantity is exact.

The oracle: a linear model with a bias and a Gaussian likelihood makes the Laplace approximation exact. At the MAP
the covariance is $(\\Phi^\top\\Phi/\\sigma^2 + \alpha I)^{-1}$, the evidence is
$\\log\\mathcal N(y \\mid 0, \\sigma^2 I + \\Phi\\Phi^\top/\alpha)$ and the predictive is the GP's.
"""

import jax
import jax.numpy as jnp
import numpy as np

from linops.models import ravel

AXES = {
    "full": {"structure": "full"},
    "diag": {"structure": "diag"},
    "kfac": {"structure": "kfac"},
    "lowrank": {"structure": "lowrank"},
    "last_layer": {"structure": "full", "subset_of_weights": "last_layer"},
}


def axes(kind: str) -> dict:
    """``laplace``'s keyword arguments of a kind named as the tests' parameters name it (``"last_layer"``: the full
    GGN of the last layer)."""
    return dict(AXES[kind])


def dense_ggn(fn, params, X, y, likelihood) -> np.ndarray:
    r"""$\sum_n J_n^\top H_n J_n$ as a dense ``P x P`` NumPy array: forward-mode Jacobians of the flat parameters and
    the likelihood's Hessian of each example (the reference the structured GGNs are checked against)."""
    flat, unravel = ravel(params)
    J = jax.jacfwd(lambda w: jax.vmap(fn, in_axes=(None, 0))(unravel(w), X))(flat)  # (N, O, P)
    out = jax.vmap(fn, in_axes=(None, 0))(params, X)
    H = jax.vmap(lambda f, t: likelihood.hessian(f, t).as_matrix())(out, y)
    return np.asarray(jnp.einsum("nop,noq,nqr->pr", J, H, J))


def linear_model(p, x):
    """The oracle's model: ``W x + b`` (one output)."""
    return p["W"] @ x + p["b"]


def design(n=40, d=3, orthogonal=False, seed=0) -> np.ndarray:
    """Centred inputs ``(n, d)`` (the bias then decouples from the weights); ``orthogonal``: orthogonal columns
    of norms 3, 2, 1.5 (a diagonal $\\Phi^\top\\Phi$: the diagonal structure is exact)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X -= X.mean(axis=0)
    if orthogonal:
        X = np.linalg.qr(X)[0] * np.array([3.0, 2.0, 1.5])[:d]  # orthogonal, still centred
    return X


def blr(X, y, alpha, sigma):
    """The exact posterior of `linear_model` on ``(X, y)``: ``(MAP params, covariance, evidence, features)``."""
    Phi = np.hstack([X, np.ones((X.shape[0], 1))])
    Lam = Phi.T @ Phi / sigma**2 + alpha * np.eye(Phi.shape[1])
    cov = np.linalg.inv(Lam)
    theta = cov @ Phi.T @ y / sigma**2
    K = sigma**2 * np.eye(X.shape[0]) + Phi @ Phi.T / alpha
    evidence = -0.5 * (y @ np.linalg.solve(K, y) + np.linalg.slogdet(K)[1] + X.shape[0] * np.log(2 * np.pi))
    params = {"W": jnp.asarray(theta[:-1][None, :]), "b": jnp.asarray(theta[-1:])}
    return params, cov, evidence, Phi
