"""Subnetwork inference (Daxberger et al., ICML 2021): the paper's toy regression and a rotated-digits shift.

1. Toy regression (figure 2): two clusters of inputs, a 2 x 50 ReLU MLP trained to its MAP
   with prior precision 3; predictive bands (mean +- 2 std) of full-covariance Laplace,
   subnetworks of 50%, 3% and 1% of the weights chosen by the Wasserstein rule (largest exact
   marginal variances, tractable here) and at random, diagonal and last-layer Laplace, and the
   MAP. The subnetworks' prior precision is rescaled by S / P (appendix C).
2. Rotated digits (the paper's rotated-MNIST experiment, on scikit-learn's 8 x 8 digits): an
   MLP trained on upright digits, evaluated at increasing rotations; log-likelihood and ECE of
   the MAP, diagonal Laplace, last-layer Laplace and subnetworks of the last layer's size
   (equal memory) chosen by diagonal SWAG (the paper's choice for ReLU networks) and at random.

Writes ``subnetwork_regression.png``, ``subnetwork_rotated_digits.png`` and
``subnetwork_summary.json`` to ``--out``. Run with ``python -m posteriors subnetwork`` (the
``examples`` extra: matplotlib, scikit-learn, scipy).
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel
from posteriors import data as pdata
from posteriors.experiments._common import pyplot, train_map


def toy_regression(out, quick, log):
    bars = not log.quiet  # progress bars of the long fits
    plt = pyplot()
    n = 80
    X, Y = pdata.inbetween(jax.random.key(0), n)
    sigma, prior = 0.1, 3.0
    fn, params = from_equinox(eqx.nn.MLP(1, 1, 50, 2, activation=jax.nn.relu, key=jax.random.key(1)))
    params = train_map(fn, params, X, Y, Gaussian(sigma), prior, steps=1500 if quick else 6000, learning_rate=1e-2,
                       key=jax.random.key(2))
    P = ravel(params)[0].shape[0]
    grid = jnp.linspace(-3.0, 3.0, 300)[:, None]
    data, lik = (X, Y), Gaussian(sigma)
    full = pst.laplace(fn, params, data, lik, structure="full", prior_precision=prior, progress=bars)
    marginals = jnp.diag(full.covariance.as_matrix())  # exact marginal variances: tractable at this size
    # weights no training input constrains (ReLU units inactive on all the data) all sit exactly at
    # the prior variance: the rule cannot rank them, so ties are broken at random
    ties = int(jnp.sum(jnp.abs(marginals - 1.0 / prior) <= 1e-6 / prior))
    last = pst.laplace(fn, params, data, lik, structure="last_layer", prior_precision=prior, progress=bars)
    posts = {f"Full cov ({P})": full,
             f"Diag ({P})": pst.laplace(fn, params, data, lik, structure="diag", prior_precision=prior, progress=bars),
             f"Final layer ({last.subset.shape[0]})": last}
    for frac in (0.5, 0.03, 0.01):
        S = int(round(frac * P))
        wass = pst.subnetwork.largest_variance(params, marginals, S, key=jax.random.key(100 + S),
                                               strategy="wasserstein")
        rand = pst.subnetwork.random(jax.random.key(S), params, S)
        posts[f"Wass {frac:.0%} ({S})"] = pst.subnetwork_laplace(fn, params, data, lik, wass, prior,
                                                                     progress=bars)
        posts[f"Rand {frac:.0%} ({S})"] = pst.subnetwork_laplace(fn, params, data, lik, rand, prior,
                                                                     progress=bars)
    order = [k for k in posts if k.startswith("Wass")] + [k for k in posts if k.startswith("Rand")] + \
        [k for k in posts if not k.startswith(("Wass", "Rand"))] + ["MAP"]
    fig, axes = plt.subplots(3, 4, figsize=(15, 9), sharex=True, sharey=True)
    mean_map = jax.vmap(fn, in_axes=(None, 0))(params, grid)[:, 0]
    summary = {}
    gap = (grid[:, 0] > -0.6) & (grid[:, 0] < 0.4)
    for ax, name in zip(axes.reshape(-1), order, strict=False):
        if name == "MAP":
            mean, std = mean_map, jnp.zeros_like(mean_map)
        else:
            m, v = pst.predictive.linearized(posts[name], grid)
            mean, std = m[:, 0], jnp.sqrt(v[:, 0])
        summary[name] = {"mean_std_in_gap": float(jnp.mean(std[gap])), "mean_std_on_data": float(jnp.mean(
            jnp.interp(X[:, 0], grid[:, 0], std)))}
        ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.25)
        ax.plot(grid[:, 0], mean, color="tab:blue")
        ax.scatter(X[:, 0], Y[:, 0], s=6, color="0.3")
        ax.set_title(name, fontsize=10)
        ax.set_ylim(-4, 4)
    for ax in axes.reshape(-1)[len(order):]:
        ax.axis("off")
    fig.suptitle("Linearised predictive, mean ± 2 std: Wasserstein (top) and random (middle) subnetworks")
    fig.tight_layout()
    fig.savefig(out / "subnetwork_regression.png", dpi=110)
    plt.close(fig)
    log(f"toy regression: P = {P}, {ties} weights at exactly the prior variance; mean std in the gap: " + ", ".join(
        f"{k}: {v['mean_std_in_gap']:.3f}" for k, v in summary.items()))
    return {"num_params": int(P), "weights_at_the_prior_variance": ties, "methods": summary}


def rotated_digits(out, quick, log):
    bars = not log.quiet
    plt = pyplot()
    images, labels = pdata.digits()
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(labels))
    train, test = perm[:1200], perm[1200:]
    Xtr, ytr = jnp.asarray(images[train].reshape(-1, 64)), jnp.asarray(labels[train])
    fn, params = from_equinox(eqx.nn.MLP(64, 10, 64, 2, activation=jax.nn.relu, key=jax.random.key(3)))
    prior = 1.0
    params = train_map(fn, params, Xtr, ytr, Categorical(), prior, steps=800 if quick else 3000, learning_rate=3e-3,
                       key=jax.random.key(4), batch_size=128)
    P = ravel(params)[0].shape[0]
    data, lik = (Xtr, ytr), Categorical()
    last = pst.laplace(fn, params, data, lik, structure="last_layer", prior_precision=prior, progress=bars)
    S = int(last.subset.shape[0])  # equal memory: subnetworks of the last layer's size
    swag = pst.subnetwork.swag(fn, params, data, lik, S, key=jax.random.key(5), num_steps=300 if quick else 2000,
                               learning_rate=1e-3, batch_size=64, progress=bars)
    rand = pst.subnetwork.random(jax.random.key(6), params, S)
    posts = {"Diag": pst.laplace(fn, params, data, lik, structure="diag", prior_precision=prior, progress=bars),
             "Last layer": last,
             f"Subnet SWAG-Wass ({S})": pst.subnetwork_laplace(fn, params, data, lik, swag, prior, progress=bars),
             f"Subnet random ({S})": pst.subnetwork_laplace(fn, params, data, lik, rand, prior, progress=bars)}
    for name in posts:  # every method's prior precision tuned by the evidence
        posts[name], _ = pst.optimize_prior_precision(posts[name], num_steps=100, progress=bars)
    angles = [0, 30, 60, 90] if quick else [0, 15, 30, 45, 60, 75, 90, 120, 150, 180]
    results = {name: {"log_likelihood": [], "ece": []} for name in ["MAP", *posts]}
    for angle in angles:
        rot = pdata.rotate(images[test], angle).reshape(-1, 64)
        Xte, yte = jnp.asarray(rot), jnp.asarray(labels[test])
        probs = {"MAP": jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, Xte), axis=-1)}
        for name, post in posts.items():
            probs[name] = pst.predictive.classification(post, Xte)
        for name, p in probs.items():
            results[name]["log_likelihood"].append(-float(pst.metrics.nll(p, yte)))
            results[name]["ece"].append(float(pst.metrics.ece(p, yte)))
        log(f"rotated digits {angle:3d} degrees: " + ", ".join(
            f"{k}: LL {v['log_likelihood'][-1]:.2f} ECE {v['ece'][-1]:.3f}" for k, v in results.items()))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, res in results.items():
        axes[0].plot(angles, res["log_likelihood"], marker="o", label=name)
        axes[1].plot(angles, res["ece"], marker="o", label=name)
    axes[0].set(xlabel="rotation (degrees)", ylabel="test log-likelihood")
    axes[1].set(xlabel="rotation (degrees)", ylabel="ECE")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "subnetwork_rotated_digits.png", dpi=110)
    plt.close(fig)
    return {"num_params": int(P), "subnetwork_size": S, "angles": angles, "results": results}


def run(out, quick, log):
    """Both experiments; writes their figures and ``subnetwork_summary.json``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {"quick": quick, "toy_regression": toy_regression(out, quick, log),
               "rotated_digits": rotated_digits(out, quick, log)}
    (out / "subnetwork_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
