"""FSP-Laplace on the paper's two toy problems, with different Gaussian-process priors.

Cinquin et al. (NeurIPS 2024), figures 1 and C.2-C.6: the same network, trained with the
FSP objective and given a Laplace posterior under different GP priors, inherits each
prior's smoothness, roughness or periodicity.

- 1-D regression: y = sin(2 pi x) + N(0, 0.1^2), x uniform on [-1, -0.5] U [0.5, 1], a 2 x 50
  tanh MLP, priors RBF / Matern-1/2 / periodic with hyperparameters fitted by the exact GP
  marginal likelihood (as the paper does), 100 grid context points for the Laplace step.
- Two moons (noise 0.1): a 2 x 100 tanh MLP with two outputs, Matern-5/2, RBF and Matern-1/2
  priors (lengthscale 1, variance 1), a 10 x 10 grid of context points over [-3.75, 3.75]^2.

- Mauna Loa CO2 (table 1): `maunaloa`.
- Tabular regression (table C.1): `posteriors.experiments.uci` (the part ``uci``).
- Image classification (table 2): `posteriors.experiments.fsp_mnist` (the part ``mnist``).

Writes ``fsp_regression.png``, ``fsp_two_moons.png``, ``fsp_maunaloa.png``, ``fsp_maunaloa.{json,md}``
and ``fsp_summary.json`` to ``--out``. Run with ``python -m posteriors fsp`` (the ``examples``
extra: ``pip install -e ".[examples]"``).
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import posteriors as pst
from linops.kernels import RBF, Matern12, Matern52, Periodic, RationalQuadratic, fit_gp
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox
from linops.runtime import flat_draw
from posteriors import data as pdata
from posteriors.experiments._common import pyplot, write_seed_table, write_table
from posteriors.experiments.training import train, train_map


def gp_prior_samples(kernel, grid, key, n):
    """Draws of the GP prior on a grid, by the symmetric square root of the dense Gram (the grid is
    small; unlike a Cholesky it does not need a jitter for the numerically low-rank periodic Gram)."""
    w, V = jnp.linalg.eigh(kernel(grid))
    root = V * jnp.sqrt(jnp.clip(w, 0.0, None))[None, :]
    return (root @ flat_draw(jax.random.normal, key, (grid.shape[0], n))).T


def regression(out, quick, log):
    plt = pyplot()
    n = 60
    X, Y = pdata.sine_gap(jax.random.key(0), n)
    grid = jnp.linspace(-2.0, 2.0, 200)[:, None]
    context = pst.context.grid(X, 100)  # 100 points on the data box padded by half its range: [-2, 2]
    priors = {"RBF": RBF(0.3, 1.0), "Matérn-1/2": Matern12(0.5, 1.0), "periodic": Periodic(1.0, 1.0, 1.0)}
    steps = 1500 if quick else 6000
    fig, axes = plt.subplots(2, len(priors), figsize=(4.2 * len(priors), 6.5), sharex=True)
    summary = {}
    for col, (name, start) in enumerate(priors.items()):
        t0 = time.perf_counter()
        kernel = fit_gp(start, X, Y[:, 0], noise_variance=0.01, num_steps=300,
                        progress=not log.quiet).kernel  # the paper's prior fit
        fn, params = from_equinox(eqx.nn.MLP(1, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(1)))
        objective = pst.fsp_objective(fn, kernel, Gaussian(0.1), num_data=n,
                                      context=lambda k: pst.context.uniform(k, X, 100))
        params, record = train(objective, params, (X, Y), steps=steps, learning_rate=3e-3, key=jax.random.key(2),
                               chunks=5, log=log, label="FSP training")
        t1 = time.perf_counter()
        post = pst.fsp_laplace(fn, params, (X, Y), kernel, context, likelihood=Gaussian(0.1), progress=not log.quiet)
        mean, var = post.predictive(grid)
        jax.block_until_ready(var)
        t2 = time.perf_counter()
        samples = post.predictive_samples(jax.random.key(3), grid, 8)[:, :, 0]
        std = jnp.sqrt(var[:, 0])
        gap = jnp.abs(grid[:, 0]) < 0.35
        summary[name] = {
            "kernel": {k: np.asarray(v).tolist() for k, v in vars(kernel).items() if isinstance(v, jax.Array)},
            "train_s": round(t1 - t0, 2), "laplace_s": round(t2 - t1, 2),
            "final_objective": float(record["objectives"][-1]),
            "lanczos_steps": int(post.info.lanczos_steps), "rank": int(post.info.rank),
            "truncated": int(post.info.truncated),
            "gap_rmse_to_sin": float(jnp.sqrt(jnp.mean((mean[gap, 0] - jnp.sin(2 * jnp.pi * grid[gap, 0])) ** 2))),
            "edge_abs_mean": float(jnp.max(jnp.abs(mean[jnp.abs(grid[:, 0]) > 1.8, 0]))),
        }
        log(f"regression {name}: {summary[name]}")
        top, bottom = axes[0, col], axes[1, col]
        for s in gp_prior_samples(kernel, grid, jax.random.key(4), 5):
            top.plot(grid[:, 0], s, lw=1, alpha=0.8)
        top.set_title(f"GP prior: {name}")
        bottom.fill_between(grid[:, 0], mean[:, 0] - 2 * std, mean[:, 0] + 2 * std, color="tab:green", alpha=0.25,
                            label="±2 std")
        for s in samples:
            bottom.plot(grid[:, 0], s, color="tab:green", lw=0.7, alpha=0.6)
        bottom.plot(grid[:, 0], mean[:, 0], color="tab:red", lw=1.5, label="mean")
        bottom.scatter(X[:, 0], Y[:, 0], s=10, color="0.4", zorder=3, label="data")
        bottom.set_ylim(-3, 3)
        bottom.set_title(f"FSP-Laplace posterior: {name}")
    axes[1, 0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fsp_regression.png", dpi=120)
    plt.close(fig)
    return summary


def two_moons(out, quick, log):
    plt = pyplot()
    X, Y = pdata.moons(jax.random.key(0), 200, noise=0.1)
    lim = 3.75
    axis = jnp.linspace(-lim, lim, 80)
    grid = jnp.stack(jnp.meshgrid(axis, axis, indexing="xy"), axis=-1).reshape(-1, 2)
    c = jnp.linspace(-lim, lim, 10)
    context = jnp.stack(jnp.meshgrid(c, c, indexing="xy"), axis=-1).reshape(-1, 2)  # the paper's 10 x 10 grid
    # Fixed hyperparameters (lengthscale 1, variance 1): the paper fits them with Milios et al.'s
    # transformation of labels into regression targets; an exact GP fit of the labels as +-1
    # targets gives lengthscales (0.17-0.37) shorter than the context grid's spacing (0.83), where
    # the prior no longer ties the context points together.
    priors = {"Matérn-5/2": Matern52(1.0, 1.0), "RBF": RBF(1.0, 1.0), "Matérn-1/2": Matern12(1.0, 1.0)}
    steps = 1000 if quick else 4000
    fig, axes = plt.subplots(2, len(priors), figsize=(4.2 * len(priors), 8))
    summary = {}
    for col, (name, start) in enumerate(priors.items()):
        t0 = time.perf_counter()
        kernel = start
        fn, params = from_equinox(eqx.nn.MLP(2, 2, 100, 2, activation=jnp.tanh, key=jax.random.key(1)))
        objective = pst.fsp_objective(fn, kernel, Categorical(), num_data=X.shape[0],
                                      context=lambda k: pst.context.uniform(k, X, 100))
        params, record = train(objective, params, (X, Y), steps=steps, learning_rate=3e-3, key=jax.random.key(2),
                               chunks=5, log=log, label="FSP training")
        t1 = time.perf_counter()
        post = pst.fsp_laplace(fn, params, (X, Y), kernel, context, likelihood=Categorical(), context_batch_size=50,
                               progress=not log.quiet)
        logits = post.predictive_samples(jax.random.key(3), grid, 100)  # (100, M, 2)
        p1 = jax.nn.softmax(logits, axis=-1)[..., 1]
        jax.block_until_ready(p1)
        t2 = time.perf_counter()
        pred = jnp.argmax(jax.vmap(fn, in_axes=(None, 0))(params, X), axis=-1)
        summary[name] = {
            "kernel": {k: np.asarray(v).tolist() for k, v in vars(kernel).items() if isinstance(v, jax.Array)},
            "train_s": round(t1 - t0, 2), "laplace_and_predict_s": round(t2 - t1, 2),
            "train_accuracy": float(jnp.mean(pred == Y)), "lanczos_steps": int(post.info.lanczos_steps),
            "rank": int(post.info.rank), "truncated": int(post.info.truncated),
            "corner_p1_mean": float(jnp.mean(p1, axis=0)[0]), "corner_p1_std": float(jnp.std(p1, axis=0)[0]),
        }
        log(f"two moons {name}: {summary[name]}")
        for row, (values, label, cmap) in enumerate(((jnp.mean(p1, axis=0), "mean p(class 1)", "RdBu_r"),
                                                     (jnp.std(p1, axis=0), "std p(class 1)", "viridis"))):
            ax = axes[row, col]
            im = ax.imshow(values.reshape(axis.shape[0], axis.shape[0]), origin="lower", cmap=cmap,
                           extent=(-lim, lim, -lim, lim), vmin=0, vmax=1 if row == 0 else None)
            ax.scatter(X[:, 0], X[:, 1], c=np.where(np.asarray(Y) == 1, "tab:red", "tab:blue"), s=6,
                       edgecolors="white", linewidths=0.3)
            ax.set_title(f"{name}: {label}")
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(out / "fsp_two_moons.png", dpi=110)
    plt.close(fig)
    return summary




def monthly_co2():
    """The statsmodels weekly Mauna Loa record (1958-2001) as monthly means, the paper's resolution:
    ``(t, y)``, ``t`` the month's mid-point in years."""
    t, y = pdata.co2()
    month = np.floor(t * 12).astype(np.int64)
    months = np.unique(month)
    means = np.array([y[month == m].mean() for m in months])
    return (months + 0.5) / 12.0, means


def _co2_features(fn_mlp, t_mean, t_std):
    """The paper's network input (x, sin 2 pi t / T, cos 2 pi t / T): x the standardised time, T one year."""
    def fn(params, x):
        phase = 2.0 * jnp.pi * (x * t_std + t_mean)  # t in years
        return fn_mlp(params, jnp.concatenate([x, jnp.sin(phase), jnp.cos(phase)]))

    return fn


def maunaloa_fit(log, *, dtype=jnp.float32, train_fraction: float = 0.7, num_context: int = 100, seed: int = 0):
    """Appendix B's Mauna Loa protocol on the offline record: monthly means, the first 70% of the months
    (chronologically) for training, the last 30% for testing, standardised time and CO2, the
    Rasmussen-Williams kernel (hyperparameters by the exact GP marginal likelihood on the training months),
    a tanh MLP 3-50-50-1 of (x, sin 2 pi t, cos 2 pi t) trained by algorithm 1 with 100 uniform context points a
    step over the whole period, and `num_context` context points on a regular grid for the Laplace step.
    ``seed``: the network's initialisation and minibatches (the GP's fit is the same for every seed).
    Returns everything the evaluation needs (the FSP posterior is left to the caller: `fsp_posterior`)."""
    t, y = monthly_co2()
    n_train = int(round(train_fraction * len(t)))
    is_train = np.arange(len(t)) < n_train
    t_mean, t_std = float(t[is_train].mean()), float(t[is_train].std())
    mu, sd = float(y[is_train].mean()), float(y[is_train].std())
    x = jnp.asarray((t - t_mean) / t_std, dtype)[:, None]
    z = jnp.asarray((y - mu) / sd, dtype)[:, None]
    X, Y, Xt = x[is_train], z[is_train], x[~is_train]
    yr = 1.0 / t_std  # one year in standardised time
    # Rasmussen & Williams (2006, section 5.4.3) starting values, in training-standard units
    start = (RBF(67 * yr, 4.0) + RBF(90 * yr, 0.05) * Periodic(1.3, yr, 1.0) + RationalQuadratic(1.2 * yr, 0.005, 0.78)
             + RBF(0.15 * yr, 0.0005))
    # --quick runs the whole protocol too (about a minute): with 100 GP steps and 1,000 network steps the MSE
    # ranking of FSP-Laplace and plain Laplace flips (7.7 against 6.9 ppm²), so a quicker run would not show it
    gp = fit_gp(start, X, Y[:, 0], noise_variance=1e-3, num_steps=300, max_points=600,
                key=jax.random.key(11), progress=not log.quiet)
    kernel, noise = gp.kernel, float(gp.noise_variance)
    sigma = float(np.sqrt(noise))
    fn_mlp, params0 = from_equinox(eqx.nn.MLP(3, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(12 + 100 * seed)))
    params0 = jax.tree_util.tree_map(lambda a: a.astype(dtype), params0)
    fn = _co2_features(fn_mlp, t_mean, t_std)
    box = jnp.array([[float(x.min())], [float(x.max())]], dtype)
    objective = pst.fsp_objective(fn, kernel, Gaussian(sigma), num_data=X.shape[0],
                                  context=lambda k: pst.context.uniform(k, box, 100, padding=0.0))
    steps = 6000
    t0 = time.perf_counter()
    fsp_params, _ = train(objective, params0, (X, Y), steps=steps, learning_rate=3e-3,
                          key=jax.random.key(13 + 100 * seed), chunks=5, log=log, label="FSP training")
    return {"t": t, "y": y, "is_train": is_train, "x": x, "X": X, "Y": Y, "Xt": Xt, "mu": mu, "sd": sd,
            "kernel": kernel, "noise": noise, "sigma": sigma, "fn": fn, "params0": params0, "steps": steps,
            "fsp_params": fsp_params, "fsp_train_s": time.perf_counter() - t0,
            "context": jnp.linspace(float(x.min()), float(x.max()), num_context, dtype=dtype)[:, None]}


def fsp_posterior(fit, log, **options):
    """`pst.fsp_laplace` on `maunaloa_fit`'s network and context grid (``options``: e.g. ``rtol``)."""
    return pst.fsp_laplace(fit["fn"], fit["fsp_params"], (fit["X"], fit["Y"]), fit["kernel"], fit["context"],
                           likelihood=Gaussian(fit["sigma"]), progress=not log.quiet, **options)


def co2_scores(fit, mean, var, noise_var) -> dict:
    """Test log-likelihood (summed over the test months, as the paper's table 1, and per month) and MSE, in ppm."""
    m = np.asarray(mean, np.float64).reshape(-1) * fit["sd"] + fit["mu"]
    v = (np.asarray(var, np.float64).reshape(-1) + noise_var) * fit["sd"] ** 2
    yt = fit["y"][~fit["is_train"]]
    ll = -0.5 * np.log(2 * np.pi * v) - 0.5 * (yt - m) ** 2 / v
    return {"test_log_likelihood": float(ll.sum()), "test_log_likelihood_per_month": float(ll.mean()),
            "test_mse": float(np.mean((yt - m) ** 2)), "test_std_mean": float(np.sqrt(v).mean())}


def maunaloa(out, quick, log, *, seed: int = 0):
    """Table 1 of the paper on the offline record (`maunaloa_fit`; ``quick`` changes nothing): FSP-Laplace under the
    Rasmussen-Williams kernel
    against linearised Laplace (full GGN, isotropic prior, prior precision and noise by the evidence) on the same
    network (in float64), and the exact GP as a reference; test log-likelihood and MSE in ppm. FSP-Laplace is
    computed in float32 and in float64 (the cut-off study of the docs' results page). ``seed``: the networks'
    initialisations and minibatches."""
    plt = pyplot()
    fit = maunaloa_fit(log, seed=seed)
    X, Y, Xt, kernel, noise, sigma, fn = (fit[k] for k in ("X", "Y", "Xt", "kernel", "noise", "sigma", "fn"))
    t, y, is_train = fit["t"], fit["y"], fit["is_train"]
    log(f"Mauna Loa: {int(is_train.sum())} training months ({t[0]:.0f}-{t[is_train][-1]:.1f}), "
        f"{int((~is_train).sum())} test months; GP noise std {sigma * fit['sd']:.3f} ppm")
    K = kernel(X) + noise * jnp.eye(X.shape[0], dtype=X.dtype)
    Ks = kernel(Xt, X)
    L = jnp.linalg.cholesky(K)
    gp_mean = Ks @ jax.scipy.linalg.cho_solve((L, True), Y[:, 0])
    V = jax.scipy.linalg.solve_triangular(L, Ks.T, lower=True)
    gp_var = jnp.clip(jnp.diag(kernel(Xt)) - jnp.sum(V**2, axis=0), 0.0)
    t0 = time.perf_counter()
    fsp_post = fsp_posterior(fit, log)
    fsp_mean, fsp_var = fsp_post.predictive(Xt)
    fsp_s = fit["fsp_train_s"] + time.perf_counter() - t0
    info = {"float32": _fsp_info(fsp_post)}
    with jax.enable_x64(True):  # the same trained network and context grid, in float64
        fit64 = dict(fit, X=X.astype(jnp.float64), Y=Y.astype(jnp.float64), context=fit["context"].astype(jnp.float64),
                     fsp_params=jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), fit["fsp_params"]))
        post64 = fsp_posterior(fit64, log)
        m64, v64 = post64.predictive(Xt.astype(jnp.float64))
        row64 = co2_scores(fit, m64, v64, sigma**2)
        info["float64"] = _fsp_info(post64)
    # plain Laplace: MAP with weight decay, full covariance, prior precision and noise by the evidence. In
    # float64: with the monthly record's small noise (GGN / sigma^2) the float32 precision at prior precision 1
    # is not numerically positive definite.
    t0 = time.perf_counter()
    map_params, _ = train_map(fn, fit["params0"], X, Y, Gaussian(sigma), 1.0, steps=fit["steps"], learning_rate=3e-3,
                           key=jax.random.key(14 + 100 * seed), log=log, label="MAP training")
    grid = jnp.linspace(float(fit["x"].min()), float(fit["x"].max()), 800)[:, None]
    with jax.enable_x64(True):
        f64 = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
        lap, report = pst.optimize_prior_precision(
            pst.laplace(fn, jax.tree_util.tree_map(f64, map_params), (f64(X), f64(Y)), Gaussian(sigma),
                        structure="full", prior_precision=1.0, progress=not log.quiet),
            tune_sigma=True, num_steps=200, progress=not log.quiet)
        lap_mean, lap_var = pst.predictive.linearized(lap, f64(Xt), progress=False)
        lap_grid = pst.predictive.linearized(lap, f64(grid), progress=False)
    lap_sigma = float(report["sigma"])
    lap_s = time.perf_counter() - t0
    rows = {"FSP-Laplace (RW kernel)": {**co2_scores(fit, fsp_mean, fsp_var, sigma**2), "fit_s": round(fsp_s, 1)},
            "FSP-Laplace (RW kernel), float64": row64,
            "Laplace (full, isotropic prior)": {**co2_scores(fit, lap_mean, lap_var, lap_sigma**2),
                                                "fit_s": round(lap_s, 1)},
            "GP (RW kernel, exact; reference)": co2_scores(fit, gp_mean, gp_var, noise)}
    for k, v in rows.items():
        log(f"Mauna Loa {k}: " + ", ".join(f"{a} {b:.3f}" for a, b in v.items()))
    columns = [("test_log_likelihood", "test log-lik. (sum) ↑"), ("test_log_likelihood_per_month", "per month ↑"),
               ("test_mse", "test MSE (ppm²) ↓"), ("test_std_mean", "mean pred. std (ppm)"), ("fit_s", "fit (s)")]
    notes = [f"statsmodels weekly CO2 as monthly means, train the first 70% ({int(is_train.sum())} months, "
             f"{t[0]:.0f}-{t[is_train][-1]:.0f}), test the last 30% ({int((~is_train).sum())} months, to "
             f"{t[-1]:.0f}); network: tanh MLP 3-50-50-1 of (x, sin 2πt, cos 2πt); FSP: {fit['context'].shape[0]} "
             "context points on a regular grid over the whole period (100 uniform ones a step in training).",
             f"FSP-Laplace kept {info['float32']['rank']} prior directions and truncated "
             f"{info['float32']['truncated']} in float32 ({info['float64']['rank']} and "
             f"{info['float64']['truncated']} in float64).",
             "The paper used the monthly NOAA record 1974-2024 (not shipped in any package): the numbers are not "
             "comparable with its table 1, only the ranking is."]
    md = write_table(out, "fsp_maunaloa", "Mauna Loa CO2: extrapolation", columns, rows, notes,
                     {"seed": seed, "gp_kernel": repr(kernel), "gp_noise_variance": noise, "fsp_info": info,
                      "laplace_report": {"prior_precision": np.asarray(report["prior_precision"]).tolist(),
                                         "sigma": lap_sigma}})
    fig, ax = plt.subplots(figsize=(11, 4))
    for label, (m, v, nv), color in (("FSP-Laplace", (*fsp_post.predictive(grid), sigma**2), "tab:green"),
                                      ("Laplace", (*lap_grid, lap_sigma**2), "tab:red")):
        m = np.asarray(m)[:, 0] * fit["sd"] + fit["mu"]
        s = np.sqrt(np.asarray(v)[:, 0] + nv) * fit["sd"]
        tt = np.asarray(grid)[:, 0] * float(np.std(t[is_train])) + float(np.mean(t[is_train]))
        ax.fill_between(tt, m - 2 * s, m + 2 * s, color=color, alpha=0.2, label=f"{label} ± 2 std")
        ax.plot(tt, m, color=color, lw=0.8, label=f"{label} mean")
    ax.plot(t[is_train], y[is_train], ".", ms=2, color="0.2", label="train")
    ax.plot(t[~is_train], y[~is_train], ".", ms=2, color="tab:orange", label="test")
    ax.set(xlabel="year", ylabel="CO2 (ppm)", title="Mauna Loa: extrapolation of the last 30% of the months")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fsp_maunaloa.png", dpi=110)
    plt.close(fig)
    return {"markdown": md, "rows": rows, "fsp_info": info, "columns": columns}


def maunaloa_seeds(out, quick, log, *, seeds: int, first: int = 0):
    """`maunaloa` once per seed ``first .. first + seeds - 1``, each into ``out/seed<k>/``, and the mean ± standard
    error of its table over them (``fsp_maunaloa_seeds.{json,md}``); the GP's row is the same for every seed."""
    chosen = list(range(first, first + seeds))
    results = [maunaloa(out / f"seed{seed}", quick, log, seed=seed) for seed in chosen]
    md = write_seed_table(out, "fsp_maunaloa_seeds", "Mauna Loa CO2: extrapolation", results[0]["columns"],
                          [r["rows"] for r in results], [f"Seeds {chosen[0]} to {chosen[-1]}: each seed's table, "
                                                         "notes and figure in seed<k>/."], {"seeds": chosen})
    return {"markdown": md, "per_seed": [r["rows"] for r in results]}


def _fsp_info(post) -> dict:
    return {"rank": int(post.info.rank), "truncated": int(post.info.truncated),
            "lanczos_steps": int(post.info.lanczos_steps), "max_variance_ratio": float(post.info.max_variance_ratio)}


def run(out, quick, log, *, parts=("regression", "two_moons", "maunaloa", "uci", "mnist"), seed: int = 0,
        seeds: int = 1):
    """The FSP experiments named in ``parts``; writes their figures, tables and ``fsp_summary.json``. ``seed`` and
    ``seeds``: Mauna Loa's networks (``seeds`` > 1: once per seed from ``seed``, `maunaloa_seeds`); the other parts
    keep their own seeds."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    summary = {"quick": quick}
    from posteriors.experiments import fsp_mnist, uci

    for part in parts:
        mauna = ((lambda o, q, lg: maunaloa(o, q, lg, seed=seed)) if seeds == 1 else
                 (lambda o, q, lg: maunaloa_seeds(o, q, lg, seeds=seeds, first=seed)))
        summary[part] = {"regression": regression, "two_moons": two_moons, "maunaloa": mauna,
                         "uci": uci.run, "mnist": fsp_mnist.run}[part](out, quick, log)
    (out / "fsp_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
