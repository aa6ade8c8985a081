"""In-between uncertainty on a 1-D toy regression (the projected-Bayes paper's figure 4; Foong et al., 2019).

Inputs in two clusters with a gap between them (`posteriors.data.inbetween`), a 2 x 50 tanh MLP
trained to its MAP, and every posterior's linearised predictive band. A posterior that
captures in-between uncertainty is wider in the gap than on the data: the table reports the
mean predictive standard deviation (of the function, without the noise) in the gap, on the
data, and their ratio, plus the test NLL of held-out points from the clusters.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import posteriors as pst
from linops.kernels import RBF
from linops.likelihoods import Gaussian
from linops.models import from_equinox, ravel
from posteriors import data as pdata
from posteriors import metrics
from posteriors.experiments import training
from posteriors.experiments._common import Log, check_methods, pyplot, write_table
from posteriors.experiments.methods import LABELS, LAPLACE_AXES, METHODS
from posteriors.experiments.training import train_map

GAP = (-0.6, 0.4)


@dataclasses.dataclass
class Config:
    """Everything the run depends on (recorded in its JSON)."""

    n: int = 80
    noise: float = 0.1
    width: int = 50
    depth: int = 2
    steps: int = 6000
    learning_rate: float = 1e-2
    prior_precision: float = 1.0
    lowrank: int = 10
    subnetwork_fraction: float = 0.1
    subnetwork_swag_steps: int = 1000
    subnetwork_swag_lr: float = 1e-3     # SGD on the mean NLL at noise 0.1: 1e-2 diverges
    fsp_steps: int = 4000
    methods: tuple = METHODS
    seed: int = 0


def _fit(method, fn, params, train, cfg, log):
    lik = Gaussian(cfg.noise)
    prior = cfg.prior_precision
    key = jax.random.key(cfg.seed + 7)
    if method == "map":
        return None
    if method in LAPLACE_AXES:
        return pst.laplace(fn, params, train, lik, **LAPLACE_AXES[method], prior_precision=prior,
                           progress=not log.quiet)
    if method == "lowrank":
        return pst.laplace(fn, params, train, lik, structure="lowrank", rank=cfg.lowrank, key=key,
                           prior_precision=prior)
    if method == "subnetwork":
        size = int(round(cfg.subnetwork_fraction * ravel(params)[0].shape[0]))
        # the subnetwork paper's rule: diagonal SWAG's variances (diagonal Laplace's pick weights without data
        # gradient, which sit at the prior variance)
        sub = pst.subnetwork.swag(fn, params, train, lik, size, key=key, num_steps=cfg.subnetwork_swag_steps,
                                  learning_rate=cfg.subnetwork_swag_lr, progress=not log.quiet)
        return pst.subnetwork_laplace(fn, params, train, lik, sub, prior, progress=not log.quiet)
    if method == "projected":
        return pst.projected_posterior(fn, params, train, batch_size=8, prior_precision=prior,
                                      progress=not log.quiet)
    if method == "loss_projected":
        return pst.loss_projected_posterior(fn, params, train, lik, batch_size=8, prior_precision=prior,
                                      progress=not log.quiet)
    if method == "fsp":
        X, _ = train
        kernel = RBF(0.5, 1.0)
        objective = pst.fsp_objective(fn, kernel, lik, num_data=X.shape[0],
                                      context=lambda k: pst.context.uniform(k, X, 100))
        fsp_params, _ = training.train(objective, params, train, steps=cfg.fsp_steps, learning_rate=3e-3,
                                       key=jax.random.key(cfg.seed + 3), chunks=5, log=log, label="FSP training")
        return pst.fsp_laplace(fn, fsp_params, train, kernel, pst.context.grid(X, 100), likelihood=lik,
                               progress=not log.quiet)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def run(cfg: Config, out: Path, log: Log, *, name: str = "inbetween") -> dict:
    """Train, fit each method, write ``name.{json,md}`` and ``name.png``."""
    check_methods(cfg.methods)
    k_train, k_test = jax.random.split(jax.random.key(cfg.seed))
    X, Y = pdata.inbetween(k_train, cfg.n, cfg.noise)
    Xt, Yt = pdata.inbetween(k_test, 200, cfg.noise)
    fn, params = from_equinox(eqx.nn.MLP(1, 1, cfg.width, cfg.depth, activation=jnp.tanh,
                                         key=jax.random.key(cfg.seed + 1)))
    params, _ = train_map(fn, params, X, Y, Gaussian(cfg.noise), cfg.prior_precision, steps=cfg.steps,
                       learning_rate=cfg.learning_rate, key=jax.random.key(cfg.seed + 2), log=log,
                       label="MAP training")
    P = int(ravel(params)[0].shape[0])
    grid = jnp.linspace(-3.0, 3.0, 300)[:, None]
    gap = (grid[:, 0] > GAP[0]) & (grid[:, 0] < GAP[1])
    rows, bands = {}, {}
    for method in cfg.methods:
        label = LABELS[method]
        t0 = time.perf_counter()
        post = _fit(method, fn, params, (X, Y), cfg, log)
        if post is None:
            mean = jax.vmap(fn, in_axes=(None, 0))(params, grid)[:, 0]
            std = jnp.zeros_like(mean)
            mt, vt = jax.vmap(fn, in_axes=(None, 0))(params, Xt), jnp.zeros_like(Yt)
        else:
            m, v = pst.predictive.linearized(post, grid, exact=True)  # 1-D: a projected one's exact band
            mean, std = m[:, 0], jnp.sqrt(jnp.clip(v[:, 0], 0.0))
            mt, vt = pst.predictive.linearized(post, Xt, exact=True)  # FSP: around its own network's mean
        fit_s = time.perf_counter() - t0
        on_data = jnp.interp(X[:, 0], grid[:, 0], std)
        row = {"std_gap": float(jnp.mean(std[gap])), "std_data": float(jnp.mean(on_data)),
               "test_nll": float(metrics.gaussian_nll(mt, vt + cfg.noise**2, Yt)), "fit_s": round(fit_s, 2)}
        row["gap_ratio"] = row["std_gap"] / max(row["std_data"], 1e-12) if post is not None else None
        rows[label] = row
        bands[label] = (np.asarray(mean), np.asarray(std))
        log(f"{label}: std in the gap {row['std_gap']:.3f}, on the data {row['std_data']:.3f}, test NLL "
            f"{row['test_nll']:.3f} ({fit_s:.1f}s)")
    columns = [("std_gap", "std in gap"), ("std_data", "std on data"), ("gap_ratio", "gap / data ↑"),
               ("test_nll", "test NLL ↓"), ("fit_s", "fit (s)")]
    notes = [f"{cfg.n} training points on [-1.5, -0.7] ∪ [0.5, 1.3], y = sin 3x + N(0, {cfg.noise}²); tanh MLP "
             f"1-{'-'.join([str(cfg.width)] * cfg.depth)}-1 ({P} parameters), prior precision "
             f"{cfg.prior_precision} for every method; the gap is {GAP}.",
             "std: of the linearised predictive function (no observation noise); test NLL adds the noise "
             "variance, on 200 fresh points from the clusters."]
    if "subnetwork" in cfg.methods:
        notes.append(f"Subnetwork Laplace: the {cfg.subnetwork_fraction:.0%} of the weights with the largest diagonal "
                     f"SWAG variance ({cfg.subnetwork_swag_steps} SGD steps at learning rate "
                     f"{cfg.subnetwork_swag_lr:g}; the subnetwork paper's rule).")
    md = write_table(out, name, "In-between uncertainty (1-D regression)", columns, rows, notes,
                     {"config": dataclasses.asdict(cfg), "num_params": P})
    plt = pyplot()
    cols = 5
    nrows = -(-len(bands) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 2.8 * nrows), sharex=True, sharey=True, squeeze=False)
    for ax, (label, (mean, std)) in zip(axes.reshape(-1), bands.items(), strict=False):
        ax.axvspan(*GAP, color="0.92", label="the gap")
        ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.3, label="mean ± 2 std")
        ax.plot(grid[:, 0], mean, color="tab:blue", lw=1.2, label="mean")
        ax.scatter(X[:, 0], Y[:, 0], s=5, color="0.2", zorder=3, label=f"training data ({X.shape[0]})")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-3, 3)
    for ax in axes[:, 0]:
        ax.set_ylabel("y")
    for ax in axes.reshape(-1)[:len(bands)]:  # every panel: an empty one below would hide the shared axis
        ax.set_xlabel("x")
        ax.tick_params(labelbottom=True)
    axes[0, 0].legend(fontsize=6, loc="lower left")
    for ax in axes.reshape(-1)[len(bands):]:
        ax.axis("off")
    fig.suptitle("Linearised predictive, mean ± 2 std (grey: the gap)")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)
    return {"markdown": md, "rows": rows, "num_params": P}
