"""Shared pieces of the experiments: MAP training with optax, progress, tables, figures."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from linops.models import ravel
from linops.runtime import canonical_convolutions, update
from posteriors.experiments.methods import METHODS


def check_methods(methods, known=METHODS) -> tuple:
    """The requested method names, or a `ValueError` listing the ``known`` ones."""
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        raise ValueError(f"unknown method(s) {unknown or list(methods)}; choose from {', '.join(known)}")
    return tuple(methods)


class Log:
    """Timestamped progress lines on stderr (``quiet`` silences them)."""

    def __init__(self, quiet: bool = False):
        self.start = time.perf_counter()
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def bar(self, label: str, done: int, total: int, extra: str = "") -> None:
        """The progress bar ``label`` at ``done`` of ``total`` steps (`linops.runtime.update`: tqdm, in place on a
        terminal and in notebooks, a few lines in a log), ``extra`` beside it; closed at ``total``."""
        if not self.quiet:
            update(f"  {label}", "step", done, total, extra)


def train_map(fn, params, X, Y, likelihood, prior_precision, *, steps, learning_rate, key, batch_size=None,
              log: Log | None = None, label="training", chunks: int = 10):
    """Adam on the negative log posterior (likelihood + Gaussian prior), jitted scans with a progress bar.

    Minibatches are drawn without replacement from every example (``batch_size`` of ``None``: full batch);
    the loss is the minibatch likelihood scaled to the whole data set plus the prior term.
    """
    flat, unravel = ravel(params)
    n = X.shape[0]
    batch_size = n if batch_size is None else min(batch_size, n)
    opt = optax.adam(learning_rate)

    def loss(theta, idx):
        out = jax.vmap(fn, in_axes=(None, 0))(unravel(theta), X[idx])
        nll = jnp.sum(jax.vmap(likelihood.nll)(out, Y[idx])) * (n / idx.shape[0])
        return nll + 0.5 * jnp.sum(prior_precision * theta**2)

    @jax.jit
    def run(theta, state, keys):
        def step(carry, k):
            th, st = carry
            idx = jax.random.choice(k, n, (batch_size,), replace=False) if batch_size < n else jnp.arange(n)
            value, grads = jax.value_and_grad(loss)(th, idx)
            updates, st = opt.update(grads, st, th)
            return (optax.apply_updates(th, updates), st), value

        (theta, state), values = jax.lax.scan(canonical_convolutions(step), (theta, state), keys)
        return theta, state, values

    state = opt.init(flat)
    keys = jax.random.split(key, steps)
    bounds = np.linspace(0, steps, chunks + 1).astype(int)
    # equal chunks compile once; the remainder (if any) once more
    for i in range(chunks):
        if bounds[i + 1] == bounds[i]:
            continue
        flat, state, values = run(flat, state, keys[bounds[i]:bounds[i + 1]])
        if log is not None:
            log.bar(label, int(bounds[i + 1]), steps, f"loss {float(values[-1]):.4g}")
    return unravel(flat)


def write_table(out: Path, name: str, title: str, columns: list[tuple[str, str]], rows: dict[str, dict],
                notes: list[str], meta: dict) -> str:
    """Write ``name.json`` (rows + meta) and ``name.md`` (a Markdown table); return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    head = "| method | " + " | ".join(label for _, label in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    lines = [f"## {title}", "", head, rule]
    for method, row in rows.items():
        cells = []
        for key, _ in columns:
            v = row.get(key)
            cells.append("—" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {n}" for n in notes] + [""]
    md = "\n".join(lines)
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps({"title": title, "columns": dict(columns), "rows": rows,
                                                  "meta": meta}, indent=2, default=_jsonable))
    return md


def _jsonable(x):
    if isinstance(x, (np.generic, jax.Array, np.ndarray)):
        return np.asarray(x).tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend, or an error naming the extra."""
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError('the experiments write figures with matplotlib: pip install -e ".[examples]"') from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
