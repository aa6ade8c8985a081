"""Training shared by the experiments and the benchmarks: Adam (or an optax optimizer) on an objective, jitted.

`train` minimises any ``objective(params, (x, y), key)`` on minibatches; `train_map` is the negative log posterior
of a network under a Gaussian prior (the MAP every posterior of the papers starts from). Both run the steps in
a few jitted chunks with a progress bar between them, may stop early at a time budget, and report what they did.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linops.likelihoods import Gaussian
    >>> from posteriors.experiments.training import train_map
    >>> X = jnp.linspace(-1.0, 1.0, 20)[:, None]
    >>> Y = 3.0 * X
    >>> fn = lambda p, x: p["w"] * x
    >>> params, record = train_map(fn, {"w": jnp.zeros(1)}, X, Y, Gaussian(0.1), 1e-3, steps=300,
    ...                            learning_rate=0.1)
    >>> bool(jnp.abs(params["w"][0] - 3.0) < 1e-2), record["steps"]
    (True, 300)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from linops.models import ravel
from linops.runtime import canonical_convolutions
from posteriors._training import positive_int


def train(objective: Callable, params, data, *, steps: int, learning_rate: float | optax.Schedule | None = None,
          optimizer: optax.GradientTransformation | None = None, key: jax.Array | None = None,
          batch_size: int | None = None, chunks: int = 10, budget_s: float | None = None, log=None,
          label: str = "training"):
    """Adam (or ``optimizer``) on ``objective(params, (x, y), key)``: ``(params, record)``.

    Args:
        objective: the scalar to minimise, of the parameters, a batch ``(x, y)`` of ``data`` and a key (fresh
            every step; ``jax.random.fold_in(k, 1)`` of the step's key ``k``).
        params: the starting parameters, any pytree of arrays.
        data: ``(X, Y)``, examples along the leading axis.
        steps: how many Adam steps at the most.
        learning_rate: Adam's, a number or an optax schedule of the step.
        optimizer: an optax optimizer instead of Adam (give one of ``learning_rate`` and ``optimizer``).
        key: the steps' keys; may be ``None`` only for full-batch training of an objective that draws nothing.
        batch_size: examples per step, drawn without replacement from all of them (``jax.random.choice`` of the
            step's key); ``None`` or ``>= N``: every example, in order.
        chunks: the steps run in this many jitted scans (equal chunks compile once; a remainder once more); the
            progress bar and the budget act between them.
        budget_s: stop after a chunk when the next one, as long as the last, would end past this many seconds.
        log: an `posteriors.experiments._common.Log` (its progress bar), or ``None``.
        label: the progress bar's label.

    Returns:
        The trained parameters and a record: ``steps`` taken, ``seconds``, ``chunk_seconds`` (each jitted
        chunk's, its compilation included) and ``objectives`` (a NumPy array, the objective at every step taken).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.training import train
        >>> X = jnp.arange(8.0)[:, None]
        >>> mse = lambda p, batch, key: jnp.mean((batch[0][:, 0] - p) ** 2)
        >>> p, record = train(mse, jnp.zeros(()), (X, X), steps=400, learning_rate=0.1, chunks=4)
        >>> round(float(p), 2), len(record["chunk_seconds"])
        (3.5, 4)
    """
    X, Y = data
    n = X.shape[0]
    steps = positive_int(steps, "steps", "train")
    batch = n if batch_size is None else min(int(batch_size), n)
    if key is None:
        if batch < n:
            raise ValueError(f"train: minibatches of {batch} of {n} examples are drawn with a key; got key=None")
        key = jax.random.key(0)  # full batch: the steps' keys reach only an objective that ignores them
    if (learning_rate is None) == (optimizer is None):
        raise ValueError("train: give one of learning_rate (Adam's) and optimizer; got "
                         f"learning_rate={learning_rate!r}, optimizer={optimizer!r}")
    opt = optax.adam(learning_rate) if optimizer is None else optimizer

    @jax.jit
    def run(p, state, keys):
        def step(carry, k):
            p, st = carry
            idx = jax.random.choice(k, n, (batch,), replace=False) if batch < n else jnp.arange(n)
            value, grads = jax.value_and_grad(objective)(p, (X[idx], Y[idx]), jax.random.fold_in(k, 1))
            updates, st = opt.update(grads, st, p)
            return (optax.apply_updates(p, updates), st), value

        (p, state), values = jax.lax.scan(canonical_convolutions(step), (p, state), keys)
        return p, state, values

    state = opt.init(params)
    keys = jax.random.split(key, steps)
    bounds = np.linspace(0, steps, max(1, min(chunks, steps)) + 1).astype(int)
    record, objectives = {"steps": 0, "seconds": 0.0, "chunk_seconds": []}, []
    t0 = time.perf_counter()
    for lo_, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi == lo_:
            continue
        elapsed = time.perf_counter() - t0
        if budget_s is not None and record["chunk_seconds"] and elapsed + record["chunk_seconds"][-1] > budget_s:
            break
        t = time.perf_counter()
        params, state, values = run(params, state, keys[lo_:hi])
        objectives.append(np.asarray(values))  # waits for the chunk
        record["chunk_seconds"].append(time.perf_counter() - t)
        record["steps"], last = int(hi), float(values[-1])
        if log is not None:
            log.bar(label, int(hi), steps, f"loss {last:.4g}")
    record["seconds"], record["objectives"] = time.perf_counter() - t0, np.concatenate(objectives)
    return params, record


def train_map(fn: Callable, params, X, Y, likelihood, prior_precision, *, steps: int,
              learning_rate: float | optax.Schedule,
              key: jax.Array | None = None, batch_size: int | None = None, chunks: int = 10,
              budget_s: float | None = None, log=None, label: str = "training"):
    """The MAP of a network: `train` on its negative log posterior, ``(params, record)``.

    The objective is the likelihood's negative log density of a minibatch, scaled to all ``N`` examples, plus
    the Gaussian prior's ``prior_precision / 2 ||theta||^2`` (a scalar or one precision per flattened parameter).
    The options are `train`'s.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.likelihoods import Categorical
        >>> from posteriors.experiments.training import train_map
        >>> X = jax.random.normal(jax.random.key(0), (64, 2))
        >>> y = (X[:, 0] > 0).astype(jnp.int32)
        >>> fn = lambda p, x: x @ p["W"]
        >>> params, record = train_map(fn, {"W": jnp.zeros((2, 2))}, X, y, Categorical(), 1.0, steps=200,
        ...                            learning_rate=0.05, key=jax.random.key(1), batch_size=16)
        >>> bool(jnp.mean(jnp.argmax(X @ params["W"], 1) == y) > 0.9), record["steps"]
        (True, 200)
    """
    flat, unravel = ravel(params)
    n = X.shape[0]

    def objective(theta, batch, _key):
        x, y = batch
        out = jax.vmap(fn, in_axes=(None, 0))(unravel(theta), x)
        nll = jnp.sum(jax.vmap(likelihood.nll)(out, y)) * (n / x.shape[0])
        return nll + 0.5 * jnp.sum(prior_precision * theta**2)

    flat, record = train(objective, flat, (X, Y), steps=steps, learning_rate=learning_rate, key=key,
                         batch_size=batch_size, chunks=chunks, budget_s=budget_s, log=log, label=label)
    return unravel(flat), record
