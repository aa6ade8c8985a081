"""Shared pieces of the experiments: progress, tables, figures (training: `posteriors.experiments.training`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from linops.runtime import update
from posteriors.experiments.methods import METHODS


def mean_se(values) -> tuple[np.ndarray, np.ndarray]:
    """The mean over the first axis (seeds, folds) and its standard error; NaN for one (no spread measured)."""
    v = np.asarray(values, float)
    se = v.std(axis=0, ddof=1) / np.sqrt(v.shape[0]) if v.shape[0] > 1 else np.full(v.shape[1:], np.nan)
    return v.mean(axis=0), se


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
