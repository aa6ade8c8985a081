r"""Evaluation metrics for classification, regression and out-of-distribution detection.

Classification metrics take predicted class probabilities ``probs`` of shape ``(N, K)`` and
integer labels ``(N,)``; every one is a mean over the examples (lower is better except for
accuracy, confidence and AUROC). Probabilities with a position axis, ``(N, T, K)`` (a sequence model's
next-token distributions) with labels ``(N, T)``, count every position as an example.

- Calibration (`ece`, `mce`): the top-class confidence in ``num_bins`` EQUAL-WIDTH bins over
  $[0, 1]$, bin $b$ holding the confidences in $((b-1)/B, b/B]$ (the first bin also holds 0);
  ECE $= \sum_b \frac{|b|}{N}\,|\mathrm{acc}_b - \mathrm{conf}_b|$, MCE $= \max_b$ over non-empty
  bins. (A common off-by-one puts the lower edge in the bin and leaves the first bin empty.)
- OOD detection (`auroc`, `fpr95`): scores where larger means "more out of distribution";
  ties count one half.

Every metric checks its input before computing and raises a ``ValueError`` (``TypeError`` for a
wrong dtype) naming the metric, what it expected and what it got:

- ``labels``: integer class indices, 1-D with one per row of ``probs``, in $[0, K)$;
- ``probs``: floating, 2-D ``(N, K)`` (or ``(N, T, K)`` with labels ``(N, T)``) with $N, K \ge 1$,
  finite, non-negative, each row summing to one within ``1e-6`` (float64), ``1e-3`` (float32) or ``1e-2``
  (16-bit floats) -- logits or unnormalised scores are refused (apply ``jax.nn.softmax(logits, axis=-1)`` first);
- OOD ``scores``: 1-D, non-empty, finite;
- regression ``mean``, ``variance`` and ``targets``: the same shape (no broadcasting: an
  ``(N, 1)`` mean against ``(N,)`` targets would score every prediction against every target),
  finite, the variance positive.

Shapes and dtypes are checked always, also under `jax.jit`; the checks of values (range,
finiteness, row sums, positivity) need concrete arrays and are skipped when an argument is a
tracer (inside `jax.jit`, `jax.vmap`, `jax.grad`). The metrics are cheap: call them outside `jit`
to have every check.

Examples:
    >>> import jax.numpy as jnp
    >>> from posteriors import metrics
    >>> probs = jnp.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    >>> labels = jnp.array([0, 1, 1])
    >>> float(metrics.accuracy(probs, labels)), round(float(metrics.ece(probs, labels, num_bins=10)), 4)
    (0.6666666865348816, 0.3)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# How far a row of probabilities may sum from one: float32 softmax over many classes, or a mean
# of sampled softmaxes, drifts by a few ulps per class; 16-bit floats hold about 3 digits.
_ROW_SUM_TOLERANCE = {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-3}
_ROW_SUM_TOLERANCE_16_BIT = 1e-2


def _is_concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def _as_probs(probs, who):
    probs = jnp.asarray(probs)
    if probs.ndim > 2 and probs.shape[-1] > 0:  # (N, T, K): a position axis, every position an example
        probs = probs.reshape(-1, probs.shape[-1])
    if not jnp.issubdtype(probs.dtype, jnp.floating):
        raise TypeError(f"{who}: probs must be floating-point class probabilities, got dtype {probs.dtype}")
    if probs.ndim != 2 or probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError(f"{who}: probs must be 2-D (N, K) with at least one example and one class, "
                         f"got shape {probs.shape}")
    if _is_concrete(probs):
        if not bool(np.all(np.isfinite(np.asarray(probs)))):
            bad = int(np.sum(~np.all(np.isfinite(np.asarray(probs)), axis=1)))
            raise ValueError(f"{who}: probs must be finite, got {bad} row(s) with NaN or inf")
        smallest = float(np.min(np.asarray(probs)))
        if smallest < 0:
            raise ValueError(f"{who}: probs must be non-negative, got an entry {smallest:.6g}; pass "
                             "probabilities, not logits (jax.nn.softmax(logits, axis=-1))")
        tolerance = _ROW_SUM_TOLERANCE.get(np.dtype(probs.dtype), _ROW_SUM_TOLERANCE_16_BIT)
        sums = np.sum(np.asarray(probs, np.float64), axis=1)
        worst = int(np.argmax(np.abs(sums - 1)))
        if not abs(float(sums[worst]) - 1) <= tolerance:
            raise ValueError(f"{who}: each row of probs must sum to one (within {tolerance:g} for "
                             f"{probs.dtype}), got row {worst} summing to {float(sums[worst]):.6g}; pass "
                             "normalised probabilities, not logits or scores (jax.nn.softmax(logits, axis=-1))")
    return probs


def _as_labels(labels, num_examples, num_classes, who):
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{who}: labels must be integer class indices, got dtype {labels.dtype} "
                        "(convert with labels.astype(int))")
    if labels.shape != (num_examples,):
        raise ValueError(f"{who}: labels must be 1-D with one label per row of probs, shape ({num_examples},), "
                         f"got shape {labels.shape}")
    if _is_concrete(labels):
        low, high = int(np.min(np.asarray(labels))), int(np.max(np.asarray(labels)))
        if low < 0 or high >= num_classes:
            raise ValueError(f"{who}: labels must lie in [0, {num_classes}) for probs with {num_classes} "
                             f"classes, got labels from {low} to {high}")
    return labels


def _check_probs(probs, labels, who):
    probs, labels = jnp.asarray(probs), jnp.asarray(labels)
    if probs.ndim > 2 and labels.shape == probs.shape[:-1]:  # a position axis: every position is an example
        probs, labels = probs.reshape(-1, probs.shape[-1]), labels.reshape(-1)
    probs = _as_probs(probs, who)
    return probs, _as_labels(labels, probs.shape[0], probs.shape[1], who)


def _as_scores(scores, name, who):
    scores = jnp.asarray(scores)
    if not (jnp.issubdtype(scores.dtype, jnp.floating) or jnp.issubdtype(scores.dtype, jnp.integer)):
        raise TypeError(f"{who}: {name} must be real numbers, got dtype {scores.dtype}")
    if scores.ndim != 1 or scores.shape[0] == 0:
        raise ValueError(f"{who}: {name} must be 1-D and non-empty (one score per example), got shape "
                         f"{scores.shape}")
    if _is_concrete(scores) and not bool(np.all(np.isfinite(np.asarray(scores)))):
        bad = int(np.sum(~np.isfinite(np.asarray(scores))))
        raise ValueError(f"{who}: {name} must be finite, got {bad} NaN or inf score(s)")
    return scores


def _check_regression(mean, variance, targets, who):
    arrays = {"mean": jnp.asarray(mean), "variance": jnp.asarray(variance), "targets": jnp.asarray(targets)}
    for name, a in arrays.items():
        if not (jnp.issubdtype(a.dtype, jnp.floating) or jnp.issubdtype(a.dtype, jnp.integer)):
            raise TypeError(f"{who}: {name} must be real numbers, got dtype {a.dtype}")
    mean, variance, targets = arrays.values()
    if not mean.shape == variance.shape == targets.shape:
        raise ValueError(f"{who}: mean, variance and targets must have the same shape (no broadcasting), got "
                         f"{mean.shape}, {variance.shape} and {targets.shape}")
    if mean.size == 0:
        raise ValueError(f"{who}: mean, variance and targets are empty (shape {mean.shape})")
    for name, a in arrays.items():
        if _is_concrete(a) and not bool(np.all(np.isfinite(np.asarray(a)))):
            raise ValueError(f"{who}: {name} must be finite, got {int(np.sum(~np.isfinite(np.asarray(a))))} NaN or inf")
    if _is_concrete(variance) and not bool(np.all(np.asarray(variance) > 0)):
        raise ValueError(f"{who}: variance must be positive, got a smallest variance of "
                         f"{float(np.min(np.asarray(variance))):.6g}")
    return mean, variance, targets


def accuracy(probs, labels) -> jax.Array:
    """The fraction of examples whose most probable class is the label.

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one, or ``labels``
            are not ``N`` integers in ``[0, K)`` (``TypeError`` for a wrong dtype; see the module docs).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import accuracy
        >>> float(accuracy(jnp.array([[0.7, 0.3], [0.6, 0.4]]), jnp.array([0, 1])))
        0.5
    """
    probs, labels = _check_probs(probs, labels, "accuracy")
    return jnp.mean(jnp.argmax(probs, axis=1) == labels)


def confidence(probs) -> jax.Array:
    """The mean top-class probability.

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import confidence
        >>> float(confidence(jnp.array([[0.75, 0.25], [0.5, 0.5]])))
        0.625
    """
    return jnp.mean(jnp.max(_as_probs(probs, "confidence"), axis=1))


def nll(probs, labels) -> jax.Array:
    """The mean negative log-probability of the labels.

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one, or ``labels``
            are not ``N`` integers in ``[0, K)`` (``TypeError`` for a wrong dtype; see the module docs).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import nll
        >>> round(float(nll(jnp.array([[0.5, 0.5]]), jnp.array([1]))), 4)   # log 2
        0.6931
    """
    probs, labels = _check_probs(probs, labels, "nll")
    p = jnp.take_along_axis(probs, labels[:, None], axis=1)[:, 0]
    return -jnp.mean(jnp.log(jnp.maximum(p, jnp.finfo(probs.dtype).tiny)))


def brier(probs, labels) -> jax.Array:
    r"""The mean Brier score $\sum_k (p_k - [y = k])^2$.

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one, or ``labels``
            are not ``N`` integers in ``[0, K)`` (``TypeError`` for a wrong dtype; see the module docs).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import brier
        >>> float(brier(jnp.array([[1.0, 0.0], [0.5, 0.5]]), jnp.array([0, 0])))   # (0 + 0.5) / 2
        0.25
    """
    probs, labels = _check_probs(probs, labels, "brier")
    onehot = jax.nn.one_hot(labels, probs.shape[1], dtype=probs.dtype)
    return jnp.mean(jnp.sum((probs - onehot) ** 2, axis=1))


def _calibration_bins(probs, labels, num_bins, who):
    if not isinstance(num_bins, (int, np.integer)) or isinstance(num_bins, bool) or num_bins < 1:
        raise ValueError(f"{who}: num_bins must be a positive integer, got {num_bins!r}")
    probs, labels = _check_probs(probs, labels, who)
    conf = jnp.max(probs, axis=1)
    correct = (jnp.argmax(probs, axis=1) == labels).astype(probs.dtype)
    # bin b (0-based) holds confidences in (b/B, (b+1)/B]; a confidence of exactly 0 goes to bin 0
    b = jnp.clip(jnp.ceil(conf * num_bins).astype(jnp.int32) - 1, 0, num_bins - 1)
    count = jnp.zeros(num_bins, probs.dtype).at[b].add(1.0)
    acc = jnp.zeros(num_bins, probs.dtype).at[b].add(correct)
    cf = jnp.zeros(num_bins, probs.dtype).at[b].add(conf)
    gap = jnp.abs(acc - cf) / jnp.maximum(count, 1.0)
    return count, gap


def ece(probs, labels, *, num_bins: int = 15) -> jax.Array:
    """The expected calibration error (equal-width bins; see the module docs).

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one, or ``labels``
            are not ``N`` integers in ``[0, K)`` (``TypeError`` for a wrong dtype; see the module docs), or
            ``num_bins < 1``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import ece
        >>> round(float(ece(jnp.array([[0.95, 0.05], [0.95, 0.05]]), jnp.array([0, 1]), num_bins=10)), 4)
        0.45
    """
    count, gap = _calibration_bins(probs, labels, num_bins, "ece")
    return jnp.sum(count * gap) / jnp.sum(count)


def mce(probs, labels, *, num_bins: int = 15) -> jax.Array:
    """The maximum calibration error over the non-empty equal-width bins.

    Raises:
        ValueError: if ``probs`` is not ``(N, K)`` with finite, non-negative rows summing to one, or ``labels``
            are not ``N`` integers in ``[0, K)`` (``TypeError`` for a wrong dtype; see the module docs), or
            ``num_bins < 1``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import mce
        >>> round(float(mce(jnp.array([[0.95, 0.05], [0.65, 0.35]]), jnp.array([0, 1]), num_bins=10)), 4)
        0.65
    """
    count, gap = _calibration_bins(probs, labels, num_bins, "mce")
    return jnp.max(jnp.where(count > 0, gap, 0.0))


def auroc(scores_in, scores_out) -> jax.Array:
    """The area under the ROC curve of separating out- from in-distribution by the score (larger = OOD).

    Raises:
        ValueError: if a score array is not 1-D, is empty or holds NaN or inf.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import auroc
        >>> float(auroc(jnp.array([0.1, 0.4]), jnp.array([0.3, 0.9])))   # 3 of 4 pairs ordered
        0.75
    """
    s_in, s_out = _as_scores(scores_in, "scores_in", "auroc"), _as_scores(scores_out, "scores_out", "auroc")
    common = jnp.result_type(s_in, s_out)
    sorted_in = jnp.sort(s_in.astype(common))
    # Mann-Whitney U / (n_in n_out): each OOD score wins against the in-scores below it and half-wins the
    # ties. Counted per OOD score and normalised before averaging, in the widest float enabled, so that
    # nothing of size n_in * n_out is formed (which overflows int32 at 10^5 x 10^5) or summed in float32.
    wide = jax.dtypes.canonicalize_dtype(jnp.float64)
    below = jnp.searchsorted(sorted_in, s_out.astype(common), side="left").astype(wide)
    below_or_tied = jnp.searchsorted(sorted_in, s_out.astype(common), side="right").astype(wide)
    return jnp.mean((below + below_or_tied) / (2.0 * s_in.shape[0]))


def fpr95(scores_in, scores_out) -> jax.Array:
    """The false-positive rate (in-distribution flagged as OOD) at the threshold that flags 95% of the OOD set.

    Raises:
        ValueError: if a score array is not 1-D, is empty or holds NaN or inf.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import fpr95
        >>> float(fpr95(jnp.arange(10.0), jnp.arange(5.0, 25.0)))   # threshold 6: in-scores 6..9 flagged
        0.4000000059604645
    """
    s_in, s_out = _as_scores(scores_in, "scores_in", "fpr95"), _as_scores(scores_out, "scores_out", "fpr95")
    # the largest threshold t with P(s_out >= t) >= 0.95
    sorted_out = jnp.sort(s_out)
    k = int(np.floor(0.05 * s_out.shape[0]))
    threshold = sorted_out[k]
    return jnp.mean(s_in >= threshold)


def gaussian_nll(mean, variance, targets) -> jax.Array:
    r"""The mean Gaussian negative log-likelihood $\tfrac12\log(2\pi\sigma^2) + (y-\mu)^2/(2\sigma^2)$.

    Raises:
        ValueError: if ``mean``, ``variance`` and ``targets`` differ in shape, hold NaN or inf, or a variance
            is not positive.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import gaussian_nll
        >>> round(float(gaussian_nll(jnp.zeros(1), jnp.ones(1), jnp.zeros(1))), 4)   # log(2 pi) / 2
        0.9189
    """
    mean, variance, targets = _check_regression(mean, variance, targets, "gaussian_nll")
    return jnp.mean(0.5 * jnp.log(2 * jnp.pi * variance) + 0.5 * (targets - mean) ** 2 / variance)


def crps(mean, variance, targets) -> jax.Array:
    r"""The mean continuous ranked probability score of Gaussian predictions (closed form, lower is better):
    $\sigma\,[z(2\Phi(z) - 1) + 2\varphi(z) - 1/\sqrt\pi]$, $z = (y - \mu)/\sigma$.

    Raises:
        ValueError: if ``mean``, ``variance`` and ``targets`` differ in shape, hold NaN or inf, or a variance
            is not positive.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import crps
        >>> round(float(crps(jnp.zeros(1), jnp.ones(1), jnp.zeros(1))), 4)   # (2 - sqrt 2) / sqrt(2 pi)
        0.2337
    """
    mean, variance, targets = _check_regression(mean, variance, targets, "crps")
    sigma = jnp.sqrt(variance)
    z = (targets - mean) / sigma
    pdf = jnp.exp(-0.5 * z**2) / jnp.sqrt(2 * jnp.pi)
    cdf = 0.5 * (1 + jax.scipy.special.erf(z / jnp.sqrt(2.0)))
    return jnp.mean(sigma * (z * (2 * cdf - 1) + 2 * pdf - 1 / jnp.sqrt(jnp.pi)))


__all__ = ["accuracy", "auroc", "brier", "confidence", "crps", "ece", "fpr95", "gaussian_nll", "mce", "nll"]
