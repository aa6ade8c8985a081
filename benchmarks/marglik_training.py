#!/usr/bin/env python
"""Calibrated without validation data: `pst.marglik_training` against a plain MAP tuned afterwards.

Issue 34's goals: on the docs' CNN (scikit-learn's 8 x 8 digits, `docs/howto/cnn.md`) and on LeNet-5 with the
5,000 offline MNIST digits, the marglik-trained network's posterior (KFAC and diag), tuned by its own evidence
with no validation data, has ECE <= 0.03 and accuracy within 0.5 points of the plainly trained MAP, and its
training takes at most 2x the MAP's.

For each network, from one initialisation and with the same optimizer, epochs and minibatches:

- *MAP*: Adam on the negative log posterior at prior precision 1 (`posteriors.experiments.training.train_map`),
  then the posterior of each structure at it, its prior tuned by the evidence afterwards
  (`optimize_prior_precision`, a layerwise prior, as laplace-torch's post-hoc tuning);
- *marglik*: `pst.marglik_training` with that structure and a layerwise prior, the evidence's hyperparameters
  updated after every epoch; and KFAC from a Monte-Carlo Fisher of one draw per example (`curvature="fisher"`,
  fresh draws at each update), whose fit takes one reverse pass per example where the GGN's takes one per class;
  and KFAC with the hyperparameters updated every 5 epochs (Immer et al.'s F = 5) instead of every epoch, with 50
  steps on the log evidence at each update instead of 10 (the same number of steps in all; each is cheap, the fit
  is the cost). Each marglik run starts from empty compilation caches (`jax.clear_caches`), as in a fresh process:
  rows of the same shapes would otherwise reuse the programs an earlier row compiled.

The predictive is the probit approximation of the linearised predictive (`pst.predictive.classification`,
its default); each posterior's predictive is also scored under the Laplace bridge and (KFAC rows) as the Monte
Carlo average over linearised draws, which approximates nothing but the link's integral. ECE with 15 bins.
Times are wall seconds of the whole call, compilation included (how a user meets it).

Run:  python benchmarks/marglik_training.py            # full run (about 24 minutes on 2 cores)
      python benchmarks/marglik_training.py --quick    # smoke run
"""

from __future__ import annotations

import time

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import from_equinox
from posteriors import metrics
from posteriors.experiments.architectures import count_params, lenet5
from posteriors.experiments.training import train_map

STRUCTURES = ("kfac", "diag")
# Variants of marglik training beyond one per structure: name -> (structure, laplace_options, marglik options).
VARIANTS = {
    "kfac, MC Fisher": ("kfac", {"curvature": "fisher", "num_samples": 1}, {}),  # KFAC of a one-draw MC Fisher
    # Immer et al.'s F = 5: the evidence after epochs 5, 10, ..., with K = 50 steps each (as many as F = 1, K = 10)
    "kfac, every 5 epochs": ("kfac", {}, {"every": 5, "hyper_steps": 50}),
}
MC_SAMPLES = 100  # the library's default; for the KFAC rows only (each such predictive of LeNet-5 takes minutes)
GOALS = {"ece": 0.03, "accuracy_points": 0.5, "time_ratio": 2.0}


class CNN(eqx.Module):
    """The docs' CNN (`docs/howto/cnn.md`): two 3 x 3 convolutions, a 2 x 2 max-pool between them, a dense head."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(1, 8, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(8, 16, 3, padding=1, key=k2)
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.head = eqx.nn.Linear(16 * 4 * 4, 10, key=k3)

    def __call__(self, x):
        x = self.pool(jax.nn.relu(self.conv1(x)))
        x = jax.nn.relu(self.conv2(x))
        return self.head(x.reshape(-1))


def problem(name, quick):
    """``(fn, params, train, test)``: the network at its initialisation and the split of the module docstring."""
    if name == "cnn":
        images, labels = pst.data.digits()
        n_train = 200 if quick else 1200
        fn, params = from_equinox(CNN(jax.random.key(1)))
    else:
        images, labels = pst.data.mnist()
        n_train = 300 if quick else 4000
        fn, params = lenet5(jax.random.key(1), size="small" if quick else "real", image_size=images.shape[-1],
                            dtype=jnp.float32)
    order = np.random.default_rng(0).permutation(len(labels))
    X = jnp.asarray(np.asarray(images, np.float32)[order][:, None])
    y = jnp.asarray(labels[order])
    n_test = 100 if quick else len(labels) - n_train
    return fn, params, (X[:n_train], y[:n_train]), (X[n_train:n_train + n_test], y[n_train:n_train + n_test])


def _metrics(probs, y):
    return {"accuracy": float(metrics.accuracy(probs, y)), "confidence": float(metrics.confidence(probs)),
            "ece": float(metrics.ece(probs, y)), "nll": float(metrics.nll(probs, y))}


def scores(post_or_none, fn, params, test, mc=False):
    """The test metrics of the network (``post_or_none`` None) or of the posterior's probit predictive, with the
    bridge's under ``"links"`` and, with ``mc``, those of `MC_SAMPLES` linearised draws (its Monte Carlo
    predictive: the same Gaussian, no approximation of the link but the draws' own error)."""
    X, y = test
    if post_or_none is None:
        return _metrics(jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, X), axis=-1), y)
    out = _metrics(pst.predictive.classification(post_or_none, X), y)
    out["links"] = {"bridge": _metrics(pst.predictive.classification(post_or_none, X, link="bridge"), y)}
    if mc:
        out["links"]["mc"] = _metrics(pst.predictive.classification(
            post_or_none, X, link="mc", key=jax.random.key(0), num_samples=MC_SAMPLES), y)
    return out


def timed(thunk):
    t = time.perf_counter()
    out = jax.block_until_ready(thunk())
    return out, time.perf_counter() - t


def run_model(name, cfg, log):
    fn, params0, train, test = problem(name, cfg["quick"])
    n, b = train[0].shape[0], cfg["batch"]
    steps = cfg["epochs"][name] * (n // b)
    lik = Categorical()
    (map_params, _), map_s = timed(lambda: train_map(fn, params0, *train, lik, 1.0, steps=steps,
                                                     learning_rate=cfg["lr"], key=jax.random.key(2), batch_size=b,
                                                     chunks=cfg["epochs"][name]))
    rows = {"MAP": {"train_s": map_s, **scores(None, fn, map_params, test)}}
    log(f"{name}: P = {count_params(params0):,}, N = {n}; MAP {map_s:.1f} s, {rows['MAP']}")
    for s in cfg["structures"]:
        if s in VARIANTS:
            continue
        post, fit_s = timed(lambda s=s: pst.optimize_prior_precision(
            pst.laplace(fn, map_params, train, lik, structure=s, progress=False), prior_structure="layerwise",
            progress=False)[0])
        rows[f"MAP + {s}, evidence-tuned after"] = {"train_s": map_s, "tune_s": fit_s,
                                                    **scores(post, fn, map_params, test, mc=s == "kfac")}
    for s in cfg["structures"]:
        structure, options, extra = VARIANTS.get(s, (s, {}, {}))
        jax.clear_caches()  # as a fresh process: no program of an earlier row
        fit, ml_s = timed(lambda structure=structure, options=options, extra=extra: pst.marglik_training(
            fn, params0, train, lik, key=jax.random.key(2), num_epochs=cfg["epochs"][name], batch_size=b,
            optimizer=optax.adam(cfg["lr"]), structure=structure, prior_structure="layerwise",
            laplace_options=options, progress=False, **extra))
        alpha = np.asarray(fit.posterior.prior_precision)  # the returned update's (the best evidence's)
        rows[f"marglik {s}"] = {"train_s": ml_s, **scores(fit.posterior, fn, fit.params, test, mc=s == "kfac"),
                                "network alone": scores(None, fn, fit.params, test),
                                "prior precision (min, max)": [float(alpha.min()), float(alpha.max())],
                                "epochs_s": float(np.sum(fit.history["epoch_seconds"])),
                                "updates_s": float(np.sum(fit.history["update_seconds"])),
                                "updates": len(fit.history["update_seconds"]),
                                "first_update_s": float(fit.history["update_seconds"][0]),
                                "log evidence (first, last)": [float(fit.history["log_marginal_likelihood"][0]),
                                                               float(fit.history["log_marginal_likelihood"][-1])]}
        log(f"  {s}: marglik {ml_s:.1f} s {rows[f'marglik {s}']}")
    goals = {}
    for s in cfg["structures"]:
        r = rows[f"marglik {s}"]
        goals[s] = {"ece": (r["ece"], r["ece"] <= GOALS["ece"]),
                    "accuracy_points": (100 * (rows["MAP"]["accuracy"] - r["accuracy"]),
                                        100 * (rows["MAP"]["accuracy"] - r["accuracy"]) <= GOALS["accuracy_points"]),
                    "time_ratio": (r["train_s"] / map_s, r["train_s"] / map_s <= GOALS["time_ratio"])}
    return {"model": name, "num_params": count_params(params0), "n_train": n, "n_test": int(test[0].shape[0]),
            "epochs": cfg["epochs"][name], "rows": rows, "goals": goals}


def _acc_conf_ece(r):
    return "-" if r is None else f"{r['accuracy']:.3f} / {r['confidence']:.3f} / {r['ece']:.3f}"


def markdown(report):
    cfg = report["config"]
    lines = H.head("Calibrated without validation data: marglik training", report) + [
        f"Adam (learning rate {cfg['lr']}), minibatches of {cfg['batch']}, the same initialisation, epochs and "
        "batches for the MAP and for `pst.marglik_training` (hyperparameters updated after every epoch with 10 Adam "
        "steps on the log evidence, unless the row says every 5 epochs: then 50 steps; a layerwise prior). The "
        "MAP's posteriors: its prior (precision 1) tuned by the evidence after training. Predictive: probit. ECE "
        "with 15 bins. Times: wall seconds, compilation included; each marglik run from empty compilation caches.",
        ""]
    for m in report["result"]:
        lines += H.section(f"{m['model']}: {m['num_params']:,} parameters, {m['n_train']} training and "
                           f"{m['n_test']} test images, {m['epochs']} epochs")
        lines += H.table(("posterior", "train s", "accuracy", "confidence", "ECE", "NLL", "network alone (acc / ECE)"),
                         [(k, f"{r['train_s']:.1f}", f"{r['accuracy']:.3f}", f"{r['confidence']:.3f}",
                           f"{r['ece']:.3f}", f"{r['nll']:.3f}",
                           (f"{r['network alone']['accuracy']:.3f} / {r['network alone']['ece']:.3f}"
                            if "network alone" in r else "")) for k, r in m["rows"].items()], "lrrrrrr")
        lines += ["", "The same posteriors' predictive under the other links (`link=\"bridge\"`: the Laplace "
                  f"bridge; `link=\"mc\"`: {MC_SAMPLES} linearised draws, the KFAC rows only), accuracy / "
                  "confidence / ECE:", ""]
        lines += H.table(("posterior", "probit", "bridge", f"MC ({MC_SAMPLES} draws)"),
                         [(k, *(_acc_conf_ece(r if link == "probit" else r["links"].get(link))
                                for link in ("probit", "bridge", "mc")))
                          for k, r in m["rows"].items() if "links" in r], "lrrr")
        lines += [""] + [f"- marglik {s}: of its {m['rows'][f'marglik {s}']['train_s']:.1f} s, the epochs took "
                         f"{m['rows'][f'marglik {s}']['epochs_s']:.1f} s and the "
                         f"{m['rows'][f'marglik {s}']['updates']} evidence updates "
                         f"{m['rows'][f'marglik {s}']['updates_s']:.1f} s (the first, which compiles the fit and "
                         f"the tuning, {m['rows'][f'marglik {s}']['first_update_s']:.1f} s)"
                         for s in m["goals"]]
        lines += [f"- marglik {s}: ECE {g['ece'][0]:.3f} (goal <= {GOALS['ece']}: "
                         f"{'met' if g['ece'][1] else '**missed**'}), accuracy "
                         f"{m['rows'][f'marglik {s}']['accuracy']:.3f} against the MAP's "
                         f"{m['rows']['MAP']['accuracy']:.3f} (goal: at most {GOALS['accuracy_points']} points lower: "
                         f"{'met' if g['accuracy_points'][1] else '**missed**'}), training time "
                         f"{g['time_ratio'][0]:.2f}x the MAP's (goal <= {GOALS['time_ratio']}: "
                         f"{'met' if g['time_ratio'][1] else '**missed**'})" for s, g in m["goals"].items()]
        lines += [f"- marglik {s}, ECE under the other links: "
                  + ", ".join(f"{link} {r['links'][link]['ece']:.3f} "
                              f"({'met' if r['links'][link]['ece'] <= GOALS['ece'] else '**missed**'})"
                              for link in ("bridge", "mc") if link in r["links"])
                  for s in m["goals"] for r in [m["rows"][f"marglik {s}"]]]
    return H.render(lines + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    cfg = {"quick": run.quick, "batch": 64 if run.quick else 128, "lr": 3e-3,
           "epochs": {"cnn": 2, "lenet5": 1} if run.quick else {"cnn": 30, "lenet5": 10},
           "structures": ("kfac",) if run.quick else STRUCTURES + tuple(VARIANTS)}
    rows = [run_model(name, cfg, run.log) for name in (("cnn",) if run.quick else ("cnn", "lenet5"))]
    run.write({"config": cfg, "result": rows}, markdown)


if __name__ == "__main__":
    main()
