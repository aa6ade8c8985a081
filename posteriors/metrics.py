r"""Evaluation metrics for classification, regression and out-of-distribution detection.

Classification metrics take predicted class probabilities ``probs`` of shape ``(N, K)`` and
integer labels ``(N,)``; every one is a mean over the examples (lower is better except for
accuracy, confidence and AUROC).

- Calibration (`ece`, `mce`): the top-class confidence in ``num_bins`` EQUAL-WIDTH bins over
  $[0, 1]$, bin $b$ holding the confidences in $((b-1)/B, b/B]$ (the first bin also holds 0);
  ECE $= \sum_b \frac{|b|}{N}\,|\mathrm{acc}_b - \mathrm{conf}_b|$, MCE $= \max_b$ over non-empty
  bins. (A common off-by-one puts the lower edge in the bin and leaves the first bin empty.)
- OOD detection (`auroc`, `fpr95`): scores where larger means "more out of distribution";
  ties count one half.

Example:
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


def _check_probs(probs, labels, who):
    probs, labels = jnp.asarray(probs), jnp.asarray(labels)
    if probs.ndim != 2 or labels.shape != probs.shape[:1]:
        raise ValueError(f"{who}: probs must be (N, K) and labels (N,), got {probs.shape} and {labels.shape}")
    return probs, labels


def accuracy(probs, labels) -> jax.Array:
    """The fraction of examples whose most probable class is the label.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import accuracy
        >>> float(accuracy(jnp.array([[0.7, 0.3], [0.6, 0.4]]), jnp.array([0, 1])))
        0.5
    """
    probs, labels = _check_probs(probs, labels, "accuracy")
    return jnp.mean(jnp.argmax(probs, axis=1) == labels)


def confidence(probs) -> jax.Array:
    """The mean top-class probability.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import confidence
        >>> float(confidence(jnp.array([[0.75, 0.25], [0.5, 0.5]])))
        0.625
    """
    return jnp.mean(jnp.max(jnp.asarray(probs), axis=1))


def nll(probs, labels) -> jax.Array:
    """The mean negative log-probability of the labels.

    Example:
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

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import brier
        >>> float(brier(jnp.array([[1.0, 0.0], [0.5, 0.5]]), jnp.array([0, 0])))   # (0 + 0.5) / 2
        0.25
    """
    probs, labels = _check_probs(probs, labels, "brier")
    onehot = jax.nn.one_hot(labels, probs.shape[1], dtype=probs.dtype)
    return jnp.mean(jnp.sum((probs - onehot) ** 2, axis=1))


def _calibration_bins(probs, labels, num_bins):
    probs, labels = _check_probs(probs, labels, "calibration")
    if not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"calibration: num_bins must be a positive integer, got {num_bins!r}")
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

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import ece
        >>> round(float(ece(jnp.array([[0.95, 0.05], [0.95, 0.05]]), jnp.array([0, 1]), num_bins=10)), 4)
        0.45
    """
    count, gap = _calibration_bins(probs, labels, num_bins)
    return jnp.sum(count * gap) / jnp.sum(count)


def mce(probs, labels, *, num_bins: int = 15) -> jax.Array:
    """The maximum calibration error over the non-empty equal-width bins.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import mce
        >>> round(float(mce(jnp.array([[0.95, 0.05], [0.65, 0.35]]), jnp.array([0, 1]), num_bins=10)), 4)
        0.65
    """
    count, gap = _calibration_bins(probs, labels, num_bins)
    return jnp.max(jnp.where(count > 0, gap, 0.0))


def auroc(scores_in, scores_out) -> jax.Array:
    """The area under the ROC curve of separating out- from in-distribution by the score (larger = OOD).

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import auroc
        >>> float(auroc(jnp.array([0.1, 0.4]), jnp.array([0.3, 0.9])))   # 3 of 4 pairs ordered
        0.75
    """
    s_in, s_out = jnp.asarray(scores_in).reshape(-1), jnp.asarray(scores_out).reshape(-1)
    # Mann-Whitney U from the ranks of the pooled scores (ties get their mean rank)
    pooled = jnp.concatenate([s_in, s_out])
    order = jnp.argsort(pooled)
    sorted_scores = pooled[order]
    # the mean 1-based rank within each group of equal scores
    first = jnp.searchsorted(sorted_scores, sorted_scores, side="left")
    last = jnp.searchsorted(sorted_scores, sorted_scores, side="right")
    mean_rank = (first + last + 1) / 2.0
    ranks = jnp.zeros_like(mean_rank).at[order].set(mean_rank)
    n_in, n_out = s_in.shape[0], s_out.shape[0]
    u = jnp.sum(ranks[n_in:]) - n_out * (n_out + 1) / 2.0
    return u / (n_in * n_out)


def fpr95(scores_in, scores_out) -> jax.Array:
    """The false-positive rate (in-distribution flagged as OOD) at the threshold that flags 95% of the OOD set.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import fpr95
        >>> float(fpr95(jnp.arange(10.0), jnp.arange(5.0, 25.0)))   # threshold 6: in-scores 6..9 flagged
        0.4000000059604645
    """
    s_in, s_out = jnp.asarray(scores_in).reshape(-1), jnp.asarray(scores_out).reshape(-1)
    # the largest threshold t with P(s_out >= t) >= 0.95
    sorted_out = jnp.sort(s_out)
    k = int(np.floor(0.05 * s_out.shape[0]))
    threshold = sorted_out[k]
    return jnp.mean(s_in >= threshold)


def gaussian_nll(mean, variance, targets) -> jax.Array:
    r"""The mean Gaussian negative log-likelihood $\tfrac12\log(2\pi\sigma^2) + (y-\mu)^2/(2\sigma^2)$.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import gaussian_nll
        >>> round(float(gaussian_nll(jnp.zeros(1), jnp.ones(1), jnp.zeros(1))), 4)   # log(2 pi) / 2
        0.9189
    """
    mean, variance, targets = jnp.asarray(mean), jnp.asarray(variance), jnp.asarray(targets)
    return jnp.mean(0.5 * jnp.log(2 * jnp.pi * variance) + 0.5 * (targets - mean) ** 2 / variance)


def crps(mean, variance, targets) -> jax.Array:
    r"""The mean continuous ranked probability score of Gaussian predictions (closed form, lower is better):
    $\sigma\,[z(2\Phi(z) - 1) + 2\varphi(z) - 1/\sqrt\pi]$, $z = (y - \mu)/\sigma$.

    Example:
        >>> import jax.numpy as jnp
        >>> from posteriors.metrics import crps
        >>> round(float(crps(jnp.zeros(1), jnp.ones(1), jnp.zeros(1))), 4)   # (2 - sqrt 2) / sqrt(2 pi)
        0.2337
    """
    mean, variance, targets = jnp.asarray(mean), jnp.asarray(variance), jnp.asarray(targets)
    sigma = jnp.sqrt(variance)
    z = (targets - mean) / sigma
    pdf = jnp.exp(-0.5 * z**2) / jnp.sqrt(2 * jnp.pi)
    cdf = 0.5 * (1 + jax.scipy.special.erf(z / jnp.sqrt(2.0)))
    return jnp.mean(sigma * (z * (2 * cdf - 1) + 2 * pdf - 1 / jnp.sqrt(jnp.pi)))


__all__ = ["accuracy", "auroc", "brier", "confidence", "crps", "ece", "fpr95", "gaussian_nll", "mce", "nll"]
