# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The linearised Laplace approximation is a Gaussian process
#
# Hennig's lecture 18 ("Uses for uncertainty in deep learning") in four steps: read the training loss as a
# negative log posterior, train to its mode $\theta^*$, take a Laplace approximation
# $q(\theta) = \mathcal N(\theta^*, \Sigma)$, and linearise the network around $\theta^*$. The predictive is then a
# Gaussian process whose mean is the trained network and whose covariance is the **Laplace tangent kernel**
#
# $$k(x, x') = J(x)\,\Sigma\,J(x')^\top, \qquad J(x) = \partial f(x, \theta^*) / \partial\theta .$$
#
# This notebook builds that kernel as a lazy operator expression, checks it against the library's linearised
# predictive and against samples of the linearised network, shows that last-layer Laplace with a Gaussian
# likelihood *is* GP regression with the network's features, and compares the lecture's menu of approximations
# of the curvature (full, diagonal, last layer, KFAC, low rank).
#
# Run it with `python notebooks/laplace.py` from the repository root (or open it in Jupyter with jupytext). It
# writes `laplace_tangent_kernel.png` and `laplace_structures.png` to `docs/figures/notebooks/`.

# %%
import os
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax

import linops as lo
import posteriors as pst
from linops.likelihoods import Gaussian
from linops.models import from_equinox, ravel

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# CI runs every notebook with LINOPS_NOTEBOOK_QUICK=1 (smaller data, fewer steps) and its figures in a temporary folder.
QUICK = os.environ.get("LINOPS_NOTEBOOK_QUICK") == "1"
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
FIGURES = Path(os.environ.get("LINOPS_NOTEBOOK_FIGURES", ROOT / "docs" / "figures" / "notebooks"))
FIGURES.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Data and a trained network
#
# Foong et al.'s in-between problem: inputs in two clusters with a gap between them, $y = \sin 3x + \varepsilon$.
# A 1-50-50-1 tanh MLP is trained to the maximum of the posterior: the Gaussian likelihood plus a Gaussian prior
# of precision $\alpha$ on every weight, the same prior the Laplace approximation then uses.

# %%
NOISE, ALPHA = 0.1, 1.0
X, Y = pst.data.inbetween(jax.random.key(0), 40 if QUICK else 80, NOISE)
model = eqx.nn.MLP(1, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(1))
fn, params = from_equinox(model)  # fn(params, x) -> (1,); params: the model's arrays
likelihood = Gaussian(NOISE)
theta0, unravel = ravel(params)
print(f"{theta0.size} parameters, {X.shape[0]} training points")


def neg_log_posterior(theta):
    out = jax.vmap(fn, in_axes=(None, 0))(unravel(theta), X)
    return jnp.sum(jax.vmap(likelihood.nll)(out, Y)) + 0.5 * ALPHA * jnp.sum(theta**2)


@jax.jit
def train(theta, steps):
    opt = optax.adam(1e-2)

    def step(carry, _):
        th, state = carry
        loss, grad = jax.value_and_grad(neg_log_posterior)(th)
        updates, state = opt.update(grad, state, th)
        return (optax.apply_updates(th, updates), state), loss

    (theta, _), losses = jax.lax.scan(step, (theta, opt.init(theta)), steps)
    return theta, losses


theta_map, losses = train(theta0, jnp.arange(1500 if QUICK else 6000))
params = unravel(theta_map)
print(f"negative log posterior: {float(losses[0]):.1f} -> {float(losses[-1]):.1f}")

# %% [markdown]
# ## The Laplace tangent kernel, as an operator
#
# `pst.laplace(..., structure="full")` builds the generalised Gauss-Newton matrix $G = \sum_n J_n^\top H_n J_n$
# (here $H_n = \sigma^{-2}$), factorises $G + \alpha I$ and returns its inverse $\Sigma$ as an operator.
# `lo.JacobianOp` is the network's Jacobian on a grid of test inputs, applied by forward- and reverse-mode
# products; it is never formed. The kernel is the lazy product `Jg @ Σ @ Jg.T`, tagged positive semidefinite by
# congruence without anyone saying so.

# %%
post = pst.laplace(fn, params, (X, Y), likelihood, structure="full", prior_precision=ALPHA)
grid = jnp.linspace(-3.0, 3.0, 120 if QUICK else 240)[:, None]
Jg = lo.JacobianOp(fn, params, grid)  # (M, P): one output per input
K = Jg @ post.covariance @ Jg.T  # the Laplace tangent kernel on the grid
print(lo.explain(K))
assert {"symmetric", "psd"} <= set(K.tags), K.tags

# %% [markdown]
# Its diagonal is the linearised predictive variance the library computes batch by batch
# (`pst.predictive.linearized`), and the whole matrix is its `full_covariance=True` output.

# %%
K_dense = K.as_matrix()
mean, var = pst.predictive.linearized(post, grid)
_, K_library = pst.predictive.linearized(post, grid, full_covariance=True)
err_diag = float(jnp.max(jnp.abs(jnp.diag(K_dense) - var[:, 0])) / jnp.max(var))
err_full = float(jnp.linalg.norm(K_dense - K_library) / jnp.linalg.norm(K_library))
print(f"relative error of diag k(x, x) against the predictive variance: {err_diag:.1e}; of the matrix: {err_full:.1e}")
assert err_diag < 1e-4 and err_full < 1e-4, "the tangent kernel must equal the linearised predictive covariance"

# %% [markdown]
# ## Samples: a GP draw and a linearised network are the same thing
#
# Two ways to draw functions from the predictive: a Gaussian-process draw $f^* + L z$ with $LL^\top = K$ and
# $z \sim \mathcal N(0, I)$, and parameters $\theta \sim q$ pushed through the linearised network,
# $f(\theta^*) + J(\theta - \theta^*)$
# (`post.predictive_samples`). Their covariances agree up to Monte Carlo error.

# %%
num_samples = 2000 if QUICK else 8000
net_samples = post.predictive_samples(jax.random.key(2), grid, num_samples)[..., 0]  # (S, M)
centred = net_samples - mean[:, 0]
K_mc = centred.T @ centred / num_samples
mc_err = float(jnp.linalg.norm(K_mc - K_dense) / jnp.linalg.norm(K_dense))
print(f"relative error of the sample covariance of {num_samples} linearised networks: {mc_err:.3f}")
assert mc_err < 8.0 / np.sqrt(num_samples), "linearised-network samples must have the tangent kernel as covariance"

# A square root of K by its eigendecomposition (K is PSD up to float32 round-off, which a Cholesky factor
# would not survive): L = V diag(sqrt(max(w, 0))).
w, V = jnp.linalg.eigh(K_dense)
L = V * jnp.sqrt(jnp.clip(w, 0.0))
gp_samples = mean[:, 0] + (L @ jax.random.normal(jax.random.key(3), (grid.shape[0], 5))).T
assert bool(jnp.all(jnp.isfinite(gp_samples)))

# %%
fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
x, std = grid[:, 0], jnp.sqrt(var[:, 0])
ax = axes[0]
im = ax.imshow(K_dense, extent=(-3, 3, 3, -3), cmap="viridis")
ax.set_title("Laplace tangent kernel $k(x, x')$")
ax.set_xlabel("$x'$")
ax.set_ylabel("$x$")
fig.colorbar(im, ax=ax, shrink=0.8)
for ax, samples, title in ((axes[1], gp_samples, "GP draws, $f^* + Lz$"),
                           (axes[2], net_samples[:5], "linearised networks, $\\theta \\sim q$")):
    ax.axvspan(-0.6, 0.4, color="0.92")
    ax.fill_between(x, mean[:, 0] - 2 * std, mean[:, 0] + 2 * std, color="tab:blue", alpha=0.2)
    ax.plot(x, samples.T, lw=0.8)
    ax.scatter(X[:, 0], Y[:, 0], s=6, color="k", zorder=3)
    ax.set_ylim(-3, 3)
    ax.set_title(title)
fig.tight_layout()
fig.savefig(FIGURES / "laplace_tangent_kernel.png", dpi=100)

# %% [markdown]
# ## Last-layer Laplace is GP regression with the network's features
#
# Keep only the last layer, $f(x) = w^\top \phi(x) + b$, with $\phi$ the trained hidden features. The model is
# linear in $(w, b)$ and the likelihood Gaussian, so the Laplace approximation is exact, and its predictive is
# the posterior of a GP with kernel $\phi(x)^\top\phi(x')/\alpha + 1/\alpha$ and noise $\sigma^2$:
#
# $$\operatorname{var} f(x_*) = k_{**} - k_*^\top (K + \sigma^2 I)^{-1} k_* .$$
#
# The library computes the left side from the last layer's GGN; the right side is textbook GP regression.

# %%
last = pst.laplace(fn, params, (X, Y), likelihood, subset_of_weights="last_layer", prior_precision=ALPHA)
_, var_last = pst.predictive.linearized(last, grid)

# `from_equinox` split the model into its arrays (`params`, the same MLP type with the non-arrays removed) and
# the rest; put the trained arrays back and run every layer but the last.
trained = eqx.combine(params, eqx.filter(model, eqx.is_inexact_array, inverse=True))


def features(x):
    h = x
    for layer in trained.layers[:-1]:
        h = trained.activation(layer(h))
    return jnp.append(h, 1.0)  # the bias is a weight on a constant feature


Phi, Phi_grid = jax.vmap(features)(X), jax.vmap(features)(grid)
K_train = Phi @ Phi.T / ALPHA
k_star = Phi @ Phi_grid.T / ALPHA
k_ss = jnp.sum(Phi_grid**2, axis=1) / ALPHA
var_gp = k_ss - jnp.sum(k_star * jnp.linalg.solve(K_train + NOISE**2 * jnp.eye(X.shape[0]), k_star), axis=0)
gp_err = float(jnp.max(jnp.abs(var_gp - var_last[:, 0])) / jnp.max(var_gp))
print(f"last-layer Laplace against GP regression on the features: max relative difference {gp_err:.1e}")
assert gp_err < 1e-3, "last-layer Laplace must equal GP regression with the feature kernel"

# %% [markdown]
# ## The menu of approximations
#
# The dense $\Sigma$ costs $P^2$ numbers and a $P^3$ factorisation; the lecture lists the ways out. Each is one
# `structure=` of `pst.laplace`, and each posterior's covariance is an operator of a different shape: `Diagonal`,
# the last layer's dense block embedded by a `Selection`, a block diagonal of Kronecker factors (KFAC), or
# diagonal-plus-low-rank from Lanczos, applied by Woodbury without ever forming a $P \times P$ matrix.
#
# With one output per example the GGN $G = \sigma^{-2}\sum_n J_n^\top J_n$ has rank at most $N$, so a low-rank
# posterior of rank $N$ keeps all of it: it is the full posterior, up to the Lanczos error.

# %%
def stored_numbers(op):
    """Numbers held by an operator's arrays (the weights and inputs it closes over included)."""
    return sum(leaf.size for leaf in jax.tree_util.tree_leaves(eqx.filter(op, eqx.is_array)))


N = X.shape[0]
posteriors = {"full": post, "last layer": last}
posteriors["diagonal"] = pst.laplace(fn, params, (X, Y), likelihood, structure="diag", prior_precision=ALPHA)
posteriors["KFAC"] = pst.laplace(fn, params, (X, Y), likelihood, structure="kfac", prior_precision=ALPHA)
posteriors["low rank (20)"] = pst.laplace(fn, params, (X, Y), likelihood, structure="lowrank", rank=20,
                                          key=jax.random.key(4), prior_precision=ALPHA)
posteriors[f"low rank ({N})"] = pst.laplace(fn, params, (X, Y), likelihood, structure="lowrank", rank=N,
                                            key=jax.random.key(5), prior_precision=ALPHA)
gap = (x > -0.6) & (x < 0.4)
bands = {}
print(f"{'structure':<16}{'covariance':<16}{'numbers':>10}{'std in gap':>12}{'std on data':>13}{'log evidence':>14}")
for name, p in posteriors.items():
    m, v = pst.predictive.linearized(p, grid)
    s = jnp.sqrt(jnp.clip(v[:, 0], 0.0))
    bands[name] = (m[:, 0], s)
    on_data = float(jnp.mean(jnp.interp(X[:, 0], x, s)))
    print(f"{name:<16}{type(p.covariance).__name__:<16}{stored_numbers(p.covariance):>10}"
          f"{float(jnp.mean(s[gap])):>12.3f}{on_data:>13.3f}{float(pst.marginal_log_likelihood(p)):>14.1f}")

_, v_rank_n = pst.predictive.linearized(posteriors[f"low rank ({N})"], grid)
rank_err32 = float(jnp.max(jnp.abs(v_rank_n - var) / var))
print(f"float32: low rank ({N}) against full, largest relative difference of the predictive variance {rank_err32:.1e}")

# %% [markdown]
# In float32 the two differ by several per cent where the posterior variance is far below the prior variance,
# although the float32 full posterior is accurate there (it is compared with float64 below). The difference is
# Lanczos's: in float32 it resolves the GGN's eigenvalues only down to about $\varepsilon_{32}\lambda_{\max}$, and
# the directions it misses keep the prior variance $1/\alpha$. In float64 the identity holds to round-off:
#
# %%
with jax.enable_x64(True):
    as64 = lambda tree: jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), tree)  # noqa: E731
    data64, params64, grid64 = as64((X, Y)), as64(params), as64(grid)
    full64 = pst.laplace(fn, params64, data64, likelihood, structure="full", prior_precision=ALPHA)
    rank64 = pst.laplace(fn, params64, data64, likelihood, structure="lowrank", rank=N, key=jax.random.key(5),
                         prior_precision=ALPHA)
    v_full64 = pst.predictive.linearized(full64, grid64)[1]
    rank_err = float(jnp.max(jnp.abs(pst.predictive.linearized(rank64, grid64)[1] - v_full64) / v_full64))
    full_err32 = float(jnp.max(jnp.abs(var - v_full64) / v_full64))
print(f"float64: low rank ({N}) against full {rank_err:.1e}; float32 full against float64 full {full_err32:.1e}")
assert rank_err < 1e-6, "a rank-N low-rank posterior must equal the full one (G has rank <= N)"

# %%
fig, axes = plt.subplots(1, len(bands), figsize=(3.0 * len(bands), 2.8), sharey=True)
for ax, (name, (m, s)) in zip(axes, bands.items(), strict=True):
    ax.axvspan(-0.6, 0.4, color="0.92")
    ax.fill_between(x, m - 2 * s, m + 2 * s, color="tab:blue", alpha=0.3)
    ax.plot(x, m, color="tab:blue", lw=1.0)
    ax.scatter(X[:, 0], Y[:, 0], s=4, color="k", zorder=3)
    ax.set_ylim(-3, 3)
    ax.set_title(name, fontsize=10)
fig.suptitle("Linearised predictive, mean ± 2 std, prior precision 1 (grey: the gap)")
fig.tight_layout()
fig.savefig(FIGURES / "laplace_structures.png", dpi=100)

# %% [markdown]
# ## The prior precision from the evidence
#
# The Laplace evidence $\log p(\mathcal D \mid \alpha)$ (`pst.marginal_log_likelihood`) is differentiable in
# $\alpha$; `pst.optimize_prior_precision` maximises it with Adam on $\log\alpha$. A changed prior changes only
# the covariance: the GGN is reused (`post.with_prior`), not recomputed.

# %%
tuned, report = pst.optimize_prior_precision(post, num_steps=100 if QUICK else 300)
evidence = report["log_marginal_likelihood"]
print(f"prior precision {ALPHA} -> {float(report['prior_precision']):.3g}; "
      f"log evidence {float(evidence[0]):.1f} -> {float(evidence[-1]):.1f}")
assert float(evidence[-1]) >= float(evidence[0]) - 1e-3, "tuning must not lower the evidence"
