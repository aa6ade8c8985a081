"""Calibration and out-of-distribution detection on real images (the projected-Bayes paper's tables 2-3).

A tanh MLP is trained (Adam, weight decay = the Gaussian prior) on the images of some classes;
every posterior is fitted around that one MAP and judged on

- the held-in test images: confidence, NLL, accuracy, Brier, ECE, MCE (table 2);
- out-of-distribution sets: the held-out classes, uniform-noise images, and the held-in test
  images rotated by 90 degrees: the AUROC of the OOD score (table 3);
- a distribution shift: accuracy, NLL and ECE of the held-in test images rotated by growing angles
  (figure 6).

Every posterior predicts the same way: ``num_samples`` linearised samples
$f(\\theta^*, x) + J(x)(\\theta_s - \\theta^*)$, class probabilities = their mean softmax, OOD
score = the largest sample variance of a logit (the paper's score for every Bayesian posterior);
the MAP's OOD score is one minus its largest softmax probability (the paper's MAP baseline).
The Laplace family's prior precisions are tuned by the evidence (`optimize_prior_precision`), the
projected posteriors use the optimal precision $r / \\|\\theta^*\\|^2$.
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
from linops.likelihoods import Categorical
from linops.memory import MemoryBudgetError
from linops.models import canonical_convolutions, from_equinox, ravel
from posteriors import data as pdata
from posteriors import metrics
from posteriors.experiments._common import LABELS, METHODS, Log, check_methods, pyplot, train_map, write_table
from posteriors.experiments.methods import DEFAULT_METHODS


@dataclasses.dataclass
class Config:
    """Everything an experiment run depends on (recorded in its JSON)."""

    dataset: str = "digits"
    in_classes: tuple = (0, 1, 2, 3, 4)
    max_train: int | None = None          # cap on training images (None: all of the held-in classes)
    max_test: int | None = None           # cap on each evaluation set
    width: int = 64
    depth: int = 2
    steps: int = 3000
    learning_rate: float = 3e-3
    batch_size: int = 128
    prior_precision: float = 1.0
    num_samples: int = 100
    projection_batch: int = 16
    projection_sweeps: int = 500
    lowrank: int = 20
    subnetwork_size: int | None = None    # None: the last layer's size (equal memory)
    marglik_steps: int = 100
    fsp_context: int = 100
    fsp_steps: int = 3000
    angles: tuple = (0, 15, 30, 45, 60, 90, 135, 180)
    methods: tuple = DEFAULT_METHODS
    seed: int = 0


def _flat(images):
    return jnp.asarray(np.asarray(images).reshape(len(images), -1))


def _cap(pair, n):
    return pair if n is None else (pair[0][:n], pair[1][:n])


def prepare(cfg: Config):
    """Train / test / OOD arrays (flattened images), all derived from ``cfg.seed``."""
    images, labels = pdata.load_images(cfg.dataset)
    k_split, k_noise = jax.random.split(jax.random.key(cfg.seed))
    (tr_x, tr_y), (te_x, te_y) = pdata.train_test_split(k_split, images, labels, 0.2)
    train, _ = pdata.split_classes(tr_x, tr_y, cfg.in_classes)
    test_in, test_out = pdata.split_classes(te_x, te_y, cfg.in_classes)
    train, test_in, test_out = _cap(train, cfg.max_train), _cap(test_in, cfg.max_test), _cap(test_out, cfg.max_test)
    side = images.shape[1:]
    n_noise = len(test_in[0])
    return {
        "train": (_flat(train[0]), jnp.asarray(train[1])),
        "test": (_flat(test_in[0]), jnp.asarray(test_in[1])),
        "test_images": test_in[0],
        "ood": {"held-out classes": _flat(test_out[0]),
                "noise": _flat(pdata.noise_images(k_noise, n_noise, side)),
                "rotated 90°": _flat(pdata.rotate(test_in[0], 90))},
    }


def fit(method: str, fn, params, train, cfg: Config, log: Log):
    """The posterior of ``method`` around the MAP ``params`` (``None`` for the MAP itself)."""
    lik = Categorical()
    prior = cfg.prior_precision
    key = jax.random.key(cfg.seed + 17)
    bars = not log.quiet  # progress bars of the long fits
    tune = lambda post: pst.optimize_prior_precision(post, num_steps=cfg.marglik_steps, progress=bars)[0]  # noqa: E731
    if method == "map":
        return None
    if method in ("full", "diag", "last_layer", "kfac"):
        return tune(pst.laplace(fn, params, train, lik, structure=method, prior_precision=prior, batch_size=256,
                                progress=bars))
    if method == "lowrank":
        return tune(pst.laplace(fn, params, train, lik, structure="lowrank", rank=cfg.lowrank, key=key,
                                prior_precision=prior, batch_size=256, progress=bars))
    if method == "subnetwork":
        size = cfg.subnetwork_size or int(pst.subnetwork.last_layer(params).size)
        sub = pst.subnetwork.diagonal_laplace(fn, params, train, lik, size, prior_precision=prior, key=key,
                                              progress=bars)
        return tune(pst.subnetwork_laplace(fn, params, train, lik, sub, prior, progress=bars))
    if method in ("projected", "loss_projected"):
        options = dict(batch_size=cfg.projection_batch, prior_precision="optimal", key=key, num_trace_samples=20,
                       max_sweeps=cfg.projection_sweeps, progress=bars)
        if method == "projected":
            return pst.projected_posterior(fn, params, train, **options)
        return pst.loss_projected_posterior(fn, params, train, lik, **options)
    if method == "fsp":
        X, Y = train
        sub = X[: min(len(X), 500)]
        sq = jnp.sum(sub**2, axis=1)
        dist = jnp.sqrt(jnp.clip(sq[:, None] + sq[None, :] - 2.0 * sub @ sub.T, 0.0))  # never (n, n, d)
        kernel = RBF(float(jnp.median(dist[jnp.triu_indices(len(sub), 1)])), 10.0)  # median distance; logit var 10
        objective = pst.fsp_objective(fn, kernel, lik, num_data=X.shape[0],
                                      context=lambda k: pst.context.from_data(k, X, cfg.fsp_context))
        fsp_params = _train_fsp(objective, params, train, cfg, log)
        context = pst.context.from_data(jax.random.key(cfg.seed + 5), X, cfg.fsp_context)
        return pst.fsp_laplace(fn, fsp_params, train, kernel, context, likelihood=lik, batch_size=256, progress=bars,
                               context_batch_size=50)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def _train_fsp(objective, init, train, cfg, log):
    """FSP trains its own network (the RKHS norm replaces the weight prior), from the MAP's initialisation."""
    import optax

    X, Y = train
    n = X.shape[0]
    opt = optax.adam(cfg.learning_rate)
    batch = min(cfg.batch_size, n)

    @jax.jit
    def run(p, state, keys):
        def step(carry, k):
            p, st = carry
            k1, k2 = jax.random.split(k)
            idx = jax.random.choice(k1, n, (batch,), replace=False)
            value, g = jax.value_and_grad(objective)(p, (X[idx], Y[idx]), k2)
            updates, st = opt.update(g, st, p)
            return (optax.apply_updates(p, updates), st), value

        (p, state), values = jax.lax.scan(canonical_convolutions(step), (p, state), keys)
        return p, state, values

    params, state = init, opt.init(init)
    keys = jax.random.split(jax.random.key(cfg.seed + 3), cfg.fsp_steps)
    for chunk in np.array_split(np.arange(cfg.fsp_steps), 5):
        params, state, values = run(params, state, keys[chunk])
        log.bar("FSP training", int(chunk[-1]) + 1, cfg.fsp_steps, f"objective {float(values[-1]):.4g}")
    return params


def draw(post, key, num_samples):
    """Parameter deviations $\theta_s - \theta^*$ ``(num_samples, P)``, drawn once and reused for every
    input set (a projected posterior's samples cost a projection each), or ``None`` for the MAP."""
    if post is None:
        return None
    return post.sample(key, num_samples) - post.mean[None, :]


def predict(post, fn, params, X, deltas):
    """``(probs, ood_score)`` of a posterior (``None``: the MAP) on inputs ``X`` from the linearised model at
    the parameter deviations ``deltas``, in chunks of 512 inputs."""
    probs, scores = [], []
    for start in range(0, X.shape[0], 512):
        x = X[start:start + 512]
        if post is None:
            p = jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, x), axis=-1)
            s = 1.0 - jnp.max(p, axis=-1)
        else:
            logits = post.linearized_outputs(deltas, x)
            p = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
            s = jnp.max(jnp.var(logits, axis=0, ddof=1), axis=-1)
        probs.append(p)
        scores.append(s)
    return jnp.concatenate(probs), jnp.concatenate(scores)


def in_distribution_metrics(probs, labels) -> dict:
    return {"confidence": float(metrics.confidence(probs)), "nll": float(metrics.nll(probs, labels)),
            "accuracy": float(metrics.accuracy(probs, labels)), "brier": float(metrics.brier(probs, labels)),
            "ece": float(metrics.ece(probs, labels)), "mce": float(metrics.mce(probs, labels))}


COLUMNS = [("confidence", "Conf. ↑"), ("nll", "NLL ↓"), ("accuracy", "Acc. ↑"), ("brier", "Brier ↓"),
           ("ece", "ECE ↓"), ("mce", "MCE ↓"), ("auroc_held-out classes", "AUROC held-out ↑"),
           ("auroc_noise", "AUROC noise ↑"), ("auroc_rotated 90°", "AUROC rot. 90° ↑"), ("fit_s", "fit (s)")]


def run(cfg: Config, out: Path, log: Log, *, name: str = "classification", shift: bool = True) -> dict:
    """Train, fit every method in ``cfg.methods``, evaluate, write ``name.{json,md}`` and the figures."""
    methods = check_methods(cfg.methods)
    d = prepare(cfg)
    X, y = d["train"]
    K = len(cfg.in_classes)
    log(f"{cfg.dataset}: {X.shape[0]} training images of classes {list(cfg.in_classes)}, {d['test'][0].shape[0]} "
        f"test, OOD sets: " + ", ".join(f"{k} ({v.shape[0]})" for k, v in d["ood"].items()))
    fn, params = from_equinox(eqx.nn.MLP(X.shape[1], K, cfg.width, cfg.depth, activation=jnp.tanh,
                                         key=jax.random.key(cfg.seed + 1)))
    t0 = time.perf_counter()
    params = train_map(fn, params, X, y, Categorical(), cfg.prior_precision, steps=cfg.steps,
                       learning_rate=cfg.learning_rate, key=jax.random.key(cfg.seed + 2), batch_size=cfg.batch_size,
                       log=log, label="MAP training")
    train_s = time.perf_counter() - t0
    P = int(ravel(params)[0].shape[0])
    log(f"MAP: {P} parameters, trained in {train_s:.1f}s")
    rows, scores, reliability, shifts, info = {}, {}, {}, {}, {}
    key = jax.random.key(cfg.seed + 99)
    shift_sets = {}
    if shift:
        for angle in cfg.angles:
            shift_sets[angle] = _flat(pdata.rotate(d["test_images"], angle))
    for method in methods:
        label = LABELS[method]
        t0 = time.perf_counter()
        try:
            post = fit(method, fn, params, d["train"], cfg, log)
            if post is not None:
                jax.block_until_ready(post.mean)
        except MemoryBudgetError as err:  # e.g. "full" on a large network: reported in the table, not fatal
            log(f"{label}: not fitted: {err}")
            rows[label] = {"error": f"{type(err).__name__}: {err}"}
            continue
        fit_s = time.perf_counter() - t0
        deltas = draw(post, key, cfg.num_samples)
        p_in, s_in = predict(post, fn, params, d["test"][0], deltas)
        row = in_distribution_metrics(p_in, d["test"][1])
        scores[label] = {"in-distribution": np.asarray(s_in)}
        for ood_name, Xo in d["ood"].items():
            _, s_out = predict(post, fn, params, Xo, deltas)
            row[f"auroc_{ood_name}"] = float(metrics.auroc(s_in, s_out))
            scores[label][ood_name] = np.asarray(s_out)
        row["fit_s"] = round(fit_s, 2)
        info[label] = _info(post)
        rows[label] = row
        reliability[label] = _reliability(p_in, d["test"][1])
        if shift:
            shifts[label] = {}
            for angle, Xr in shift_sets.items():
                p, _ = predict(post, fn, params, Xr, deltas)
                shifts[label][angle] = {"accuracy": float(metrics.accuracy(p, d["test"][1])),
                                        "nll": float(metrics.nll(p, d["test"][1])),
                                        "ece": float(metrics.ece(p, d["test"][1]))}
        log(f"{label}: fitted in {fit_s:.1f}s; " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "fit_s"))
    notes = [f"{cfg.dataset}: train on classes {list(cfg.in_classes)} ({X.shape[0]} images), tanh MLP "
             f"{X.shape[1]}-{'-'.join([str(cfg.width)] * cfg.depth)}-{K} ({P} parameters), MAP by Adam "
             f"({cfg.steps} steps, prior precision {cfg.prior_precision}) in {train_s:.1f}s.",
             f"Predictive of every posterior: {cfg.num_samples} linearised samples; OOD score = largest logit "
             "variance (MAP: 1 - max softmax).",
             "Laplace family: prior precision tuned by the evidence; projected posteriors: the optimal "
             "precision r / ||θ*||²."]
    md = write_table(out, name, f"{cfg.dataset}: in-distribution metrics and OOD AUROC", COLUMNS, rows, notes,
                     {"config": dataclasses.asdict(cfg), "num_params": P, "train_s": train_s, "posteriors": info,
                      "shift": {k: {str(a): v for a, v in s.items()} for k, s in shifts.items()}})
    _figures(out, name, reliability, scores, shifts)
    return {"markdown": md, "rows": rows, "shift": shifts, "num_params": P}


def _info(post) -> dict:
    if post is None:
        return {}
    out = {}
    for attr in ("prior_precision",):
        if hasattr(post, attr):
            v = np.asarray(getattr(post, attr))
            out[attr] = float(v) if v.size == 1 else float(v.mean())
    est = getattr(post, "trace_estimate", None)
    if est is not None:
        out["trace_pi"] = float(est.value)
        out["trace_pi_stderr"] = float(est.standard_error)
    return out


def _reliability(probs, labels, num_bins: int = 10) -> dict:
    conf = np.asarray(jnp.max(probs, axis=-1))
    correct = np.asarray(jnp.argmax(probs, axis=-1) == labels)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, num_bins - 1)
    acc = [float(correct[which == b].mean()) if np.any(which == b) else None for b in range(num_bins)]
    cnt = [int(np.sum(which == b)) for b in range(num_bins)]
    return {"edges": edges.tolist(), "accuracy": acc, "count": cnt}


def _figures(out, name, reliability, scores, shifts):
    plt = pyplot()
    from matplotlib.ticker import NullFormatter

    labels = list(reliability)
    cols = min(len(labels), 5)
    rows = -(-len(labels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.4 * rows), squeeze=False)
    for ax, label in zip(axes.reshape(-1), labels, strict=False):
        r = reliability[label]
        centers = (np.array(r["edges"][:-1]) + np.array(r["edges"][1:])) / 2
        acc = np.array([np.nan if a is None else a for a in r["accuracy"]])
        ax.bar(centers, acc, width=0.1, edgecolor="k", color="tab:blue", alpha=0.7, label="accuracy")
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
        for x, a, n in zip(centers, acc, r["count"], strict=True):  # how many test images each bin holds
            if n:
                ax.text(x, min(a, 0.9) + 0.03, str(n), ha="center", fontsize=6, rotation=90,
                        bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0, "pad": 0.5})
        ax.set(title=label, xlim=(0, 1), ylim=(0, 1), xlabel="confidence (bin)", ylabel="accuracy in the bin")
        ax.legend(fontsize=6, loc="upper left")
    for ax in axes.reshape(-1)[len(labels):]:
        ax.axis("off")
    fig.suptitle("Reliability diagrams (held-in test images; the number on a bar: the images in its bin)")
    fig.tight_layout()
    fig.savefig(out / f"{name}_reliability.png", dpi=100)
    plt.close(fig)

    # Empirical CDFs on a log axis: scores that differ by orders of magnitude (a projected posterior's held-in
    # scores are near zero) stay apart, and no colours overlap as translucent histograms would.
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    styles = ["-", "--", "-.", ":"]
    for ax, label in zip(axes.reshape(-1), labels, strict=False):
        s = scores[label]
        positive = np.concatenate([np.asarray(v)[np.asarray(v) > 0] for v in s.values()])
        floor = float(np.min(positive)) if positive.size else 1e-12
        for i, (set_name, v) in enumerate(s.items()):
            v = np.sort(np.maximum(np.asarray(v, dtype=float), floor))
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", ls=styles[i % len(styles)], lw=1.3,
                    label=f"{set_name} ({v.size})")
        ax.set(title=label, xscale="log", xlabel="OOD score (log)", ylabel="fraction of images <= score",
               ylim=(0, 1.02))
        ax.xaxis.set_minor_formatter(NullFormatter())  # a narrow log range labels its minor ticks on top of each other
        ax.legend(fontsize=6, loc="best")
    for ax in axes.reshape(-1)[len(labels):]:
        ax.axis("off")
    fig.suptitle("OOD scores: held-in test images vs OOD sets (curves further right: more uncertain)")
    fig.tight_layout()
    fig.savefig(out / f"{name}_ood_scores.png", dpi=100)
    plt.close(fig)

    if shifts:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for label, by_angle in shifts.items():
            angles = list(by_angle)
            for ax, metric in zip(axes, ("accuracy", "nll", "ece"), strict=True):
                ax.plot(angles, [by_angle[a][metric] for a in angles], marker="o", label=label)
        for ax, metric in zip(axes, ("accuracy", "NLL", "ECE"), strict=True):
            ax.set(xlabel="rotation (degrees)", ylabel=metric)
        axes[0].legend(fontsize=7)
        fig.suptitle("Rotated held-in test images")
        fig.tight_layout()
        fig.savefig(out / f"{name}_rotation.png", dpi=100)
        plt.close(fig)
