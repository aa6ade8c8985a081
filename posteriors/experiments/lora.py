r"""Laplace-LoRA (Yang et al., 2024) on the byte-level transformer: pretrain, fine-tune adapters, Laplace on them.

`run` (`finetuned`, then `evaluate`) pretrains `posteriors.experiments.transformer.gpt` on the standard library's
source code, adds LoRA adapters on the attention's query and value projections, fine-tunes them (the base frozen)
to the MAP of a Gaussian prior on sequences of the documentation prose of ``pydoc_data``, and fits
`posteriors.laplace` on the adapters alone. The prior precision is tuned by the evidence; the predictive over next
bytes is the linearised one (probit), its variances exact or, over a 256-byte vocabulary at scale, from linearised
samples (`sampled_variances`). It compares the Laplace predictive with the fine-tuned MAP's on held-out prose
(per-byte NLL, ECE, accuracy) and on marshalled byte code (OOD AUROC of the mean predictive entropy per
sequence), as the Laplace-LoRA paper compares them.

Examples:
    >>> import jax
    >>> from posteriors.experiments.lora import run
    >>> r = run(jax.random.key(0), size="small", rank=2, pretrain_steps=20, finetune_steps=20, num_fit=8, num_test=4,
    ...         length=8, quiet=True)
    >>> sorted(r["rows"]), r["num_adapter_params"]
    (['Laplace-LoRA (kfac)', 'MAP'], 128)
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import posteriors as pst
from linops.likelihoods import Categorical
from posteriors.experiments._common import Log
from posteriors.experiments.architectures import count_params
from posteriors.experiments.training import train
from posteriors.experiments.transformer import adapters_only, add_lora, corpus, gpt, lora_weights, windows


def _token_nll(fn, params, x, y):
    """The mean next-byte NLL of a batch of sequences."""
    logits = jax.vmap(fn, in_axes=(None, 0))(params, x)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0])


def _entropy_per_sequence(probs):
    """``(M,)``: the mean predictive entropy over each sequence's positions (larger: more out of distribution)."""
    return jnp.mean(-jnp.sum(probs * jnp.log(probs + jnp.finfo(probs.dtype).tiny), axis=-1), axis=-1)


def _metrics(probs, labels, probs_ood):
    return {"nll": float(pst.metrics.nll(probs, labels)), "ece": float(pst.metrics.ece(probs, labels)),
            "accuracy": float(pst.metrics.accuracy(probs, labels)),
            "auroc": float(pst.metrics.auroc(_entropy_per_sequence(probs), _entropy_per_sequence(probs_ood)))}


def finetuned(key, *, size: str = "real", rank: int = 8, pretrain_steps: int = 300, finetune_steps: int = 200,
              num_fit: int = 128, num_test: int = 32, length: int = 128, prior_precision: float = 1.0,
              batch_size: int = 16, quiet: bool = False) -> dict:
    """The model pretrained, its adapters fine-tuned, and the data: a dict of ``fn``, ``params``, ``fit``
    (``(X, Y)``), ``test`` (held-out prose ``(X, Y)``), ``ood`` (byte code inputs), ``times`` and ``settings``.

    Args:
        key: every draw's key (windows, initialisation, minibatches).
        size: `gpt`'s size (``"real"``: 12.9M parameters; ``"small"``: 12k, for tests).
        rank: the adapters' rank (query and value projections of every block).
        pretrain_steps: Adam steps of the base model (batches of ``batch_size`` sequences).
        finetune_steps: Adam steps of the adapters.
        num_fit: fine-tuning (and Laplace) sequences.
        num_test: test sequences, in and out of distribution each.
        length: the sequences' length in bytes.
        batch_size: sequences per step.
        prior_precision: the adapters' prior precision while fine-tuning (the evidence tunes the Laplace one).
        quiet: no progress lines.
    """
    log = Log(quiet)
    keys = jax.random.split(key, 8)
    text, prose, code = corpus("train"), corpus("docs"), corpus("bytecode")
    cut = int(0.8 * len(prose))  # fine-tune on the first 80% of the prose, test on the rest
    fn, params = gpt(keys[0], size=size, context=length)
    Xp, Yp = windows(text, max(4 * batch_size, 512), length, keys[1])
    t0 = time.perf_counter()
    params, record = train(lambda p, b, _k: _token_nll(fn, p, *b), params, (Xp, Yp), steps=pretrain_steps,
                           learning_rate=1e-3, key=keys[2], batch_size=batch_size, log=log, label="pretraining")
    times = {"pretrain_s": time.perf_counter() - t0, "pretrain_loss": float(record["objectives"][-1])}
    log(f"pretrained {count_params(params):,} parameters: loss {times['pretrain_loss']:.3f} nats per byte")

    fn, params = add_lora(fn, params, keys[3], rank=rank)
    trainable, merge = adapters_only(params)
    X, Y = windows(prose[:cut], num_fit, length, keys[4])

    def objective(t, batch, _k):  # the adapters' negative log posterior (summed NLL scaled to every sequence)
        x, y = batch
        nll = _token_nll(fn, merge(t), x, y) * length * num_fit
        return nll + 0.5 * prior_precision * sum(jnp.sum(a**2) for a in jax.tree_util.tree_leaves(t))

    t0 = time.perf_counter()
    trainable, record = train(objective, trainable, (X, Y), steps=finetune_steps,
                              optimizer=optax.adam(1e-3), key=keys[7], batch_size=min(batch_size, num_fit),
                              log=log, label="fine-tuning adapters")
    times["finetune_s"] = time.perf_counter() - t0
    times["finetune_loss"] = float(record["objectives"][-1]) / (length * num_fit)
    return {"fn": fn, "params": merge(trainable), "fit": (X, Y),
            "test": windows(prose[cut:], num_test, length, keys[5]), "ood": windows(code, num_test, length, keys[6])[0],
            "times": times, "settings": dict(size=size, rank=rank, pretrain_steps=pretrain_steps,
                                             finetune_steps=finetune_steps, num_fit=num_fit, num_test=num_test,
                                             length=length, prior_precision=prior_precision)}


def evaluate(problem: dict, key, *, structure: str = "kfac", curvature: str = "fisher", num_samples: int = 1,
             predictive_samples: int | None = None, quiet: bool = False, measure=None) -> dict:
    """Laplace on the adapters of a `finetuned` problem, its prior tuned by the evidence, against the MAP: the rows
    (``"MAP"``, ``"Laplace-LoRA (structure)"``: per-byte NLL, ECE, accuracy on held-out prose, AUROC against byte
    code), the fit's and the predictive's seconds, the tuned prior precision.

    Args:
        problem: `finetuned`'s.
        key: the Monte-Carlo Fisher's and the predictive samples' key.
        structure: `posteriors.laplace`'s.
        curvature: `posteriors.laplace`'s (``"fisher"``: ``num_samples`` sampled sequences per example, one reverse
            pass each, where the exact GGN takes ``length x 256``).
        num_samples: the Monte-Carlo Fisher's sequences per example.
        predictive_samples: the linearised predictive's variances from this many linearised samples
            (`posteriors.predictive.sampled_variances`: one JVP per sample and sequence); None: exact.
        quiet: no progress bars.
        measure: ``measure(call) -> (output, seconds, peak bytes or None)`` runs the fit and the predictive (a
            benchmark's memory probe); default: timed only.
    """
    fn, params, (X, Y), (Xt, Yt), Xo = (problem[k] for k in ("fn", "params", "fit", "test", "ood"))
    adapters = lora_weights(params)
    measure = _timed if measure is None else measure

    def fit():
        post = pst.laplace(fn, params, (X, Y), Categorical(), structure=structure, subset_of_weights=adapters,
                           curvature=curvature, num_samples=num_samples, key=jax.random.fold_in(key, 11),
                           progress=not quiet)
        return pst.optimize_prior_precision(post)[0]

    def predict():
        probs = {}
        for name, inputs in (("test", Xt), ("ood", Xo)):
            if predictive_samples is None:
                probs[name] = pst.predictive.classification(post, inputs, progress=not quiet)
            else:
                mean = jax.vmap(fn, in_axes=(None, 0))(params, inputs)
                var = pst.predictive.sampled_variances(post, jax.random.fold_in(key, 12), inputs, predictive_samples)
                probs[name] = pst.predictive.probit(mean, var.value)
        return probs

    post, fit_s, fit_bytes = measure(fit)
    probs, predictive_s, predictive_bytes = measure(predict)
    map_probs = {name: jax.nn.softmax(jax.vmap(fn, in_axes=(None, 0))(params, x), axis=-1)
                 for name, x in (("test", Xt), ("ood", Xo))}
    return {"rows": {"MAP": _metrics(map_probs["test"], Yt, map_probs["ood"]),
                     f"Laplace-LoRA ({structure})": _metrics(probs["test"], Yt, probs["ood"])},
            "fit_s": fit_s, "predictive_s": predictive_s, "fit_peak_bytes": fit_bytes,
            "predictive_peak_bytes": predictive_bytes, "prior_precision": float(np.mean(post.prior_precision)),
            "num_adapter_params": sum(adapters.group_sizes(params)),
            "settings": dict(structure=structure, curvature=curvature, num_samples=num_samples,
                             predictive_samples=predictive_samples)}


def _timed(call):
    t0 = time.perf_counter()
    out = jax.block_until_ready(call())
    return out, time.perf_counter() - t0, None


def run(key, *, structure: str = "kfac", curvature: str = "fisher", num_samples: int = 1,
        predictive_samples: int | None = None, quiet: bool = False, **options) -> dict:
    """`finetuned` (with ``options``), then `evaluate`: the rows, the times, the sizes and the settings."""
    k1, k2 = jax.random.split(key)
    problem = finetuned(k1, quiet=quiet, **options)
    result = evaluate(problem, k2, structure=structure, curvature=curvature, num_samples=num_samples,
                      predictive_samples=predictive_samples, quiet=quiet)
    return {**result, "times": {**problem["times"], "fit_s": result["fit_s"], "predictive_s": result["predictive_s"]},
            "num_params": count_params(problem["params"]), "settings": {**problem["settings"], **result["settings"]}}


__all__ = ["evaluate", "finetuned", "run"]
