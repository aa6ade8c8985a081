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


FINE_STEPS = tuple(k / 4 for k in (-3, -2, -1, 1, 2, 3))
"""`grid_search`'s fine grid: the coarse grid's best times ``10**step`` for each step (quarter decades)."""


def grid_search(nll_of, grid, *, refine: bool = False, limits=(1e-8, 1e8), also=()) -> tuple[float, dict, bool]:
    """The value of ``grid`` and ``also`` (prior precisions; ``also``: another grid's points) with the lowest
    ``nll_of(value)`` (a validation NLL); with ``refine``, a decade more at a time while the best is the edge of
    what was tried (within ``limits``), then quarter decades around it (`FINE_STEPS`). A value whose posterior is
    not numerically positive definite (the library's `ValueError`: too small a precision for the dtype) gets an
    infinite NLL.
    Returns ``(best, {value: NLL} sorted, at_edge)``, ``at_edge`` when the best is the smallest or largest value
    tried (the search did not bracket it).

    Examples:
        >>> from posteriors.experiments._common import grid_search
        >>> best, nlls, at_edge = grid_search(lambda a: (a - 300.0) ** 2, (1.0, 10.0, 100.0), refine=True)
        >>> round(best, 1), at_edge, len(nlls)     # 100 at the edge: 1,000 tried, then quarter decades
        (316.2, False, 10)
    """
    nlls = {}

    def search(values):
        for value in values:
            if float(value) not in nlls:
                try:
                    nlls[float(value)] = float(nll_of(float(value)))
                except ValueError as err:  # too small a precision for the dtype: a losing candidate, not a failure
                    if "not numerically positive definite" not in str(err):
                        raise
                    nlls[float(value)] = float("inf")
        return min(nlls, key=nlls.get)

    best = search((*grid, *also))
    if refine:
        while best == max(nlls) and best < limits[1] or best == min(nlls) and best > limits[0]:
            best = search([best * (10.0 if best == max(nlls) else 0.1)])
        best = search([best * 10.0**step for step in FINE_STEPS])
    return best, dict(sorted(nlls.items())), best in (min(nlls), max(nlls))


def swag_search(fit_at, nll_of, grid, log, who: str) -> dict:
    """``{(learning rate, weight decay): (validation NLL, posterior)}`` for each pair of ``grid``: ``fit_at(lr,
    wd)`` fits SWAG, ``nll_of(posterior)`` scores it. A pair at which SGD diverges gets an infinite NLL and no
    posterior (logged), not an error.

    Examples:
        >>> from posteriors.experiments._common import Log, swag_search
        >>> def fit_at(lr, wd):
        ...     if lr > 0.1:
        ...         raise ValueError("swag: the run diverged (3 non-finite entries)")
        ...     return lr + wd
        >>> fits = swag_search(fit_at, lambda post: abs(post - 0.011), [(1e-2, 1e-3), (1.0, 0.0)], Log(quiet=True), "x")
        >>> min(fits, key=lambda k: fits[k][0]), fits[(1.0, 0.0)]
        ((0.01, 0.001), (inf, None))
    """
    fits = {}
    for lr, wd in grid:
        try:
            post = fit_at(float(lr), float(wd))
        except ValueError as err:  # a learning rate too large for the network: a losing candidate
            if "diverged" not in str(err):
                raise
            log(f"{who}: SWAG at learning rate {lr:g}, weight decay {wd:g}: {err}")
            fits[(float(lr), float(wd))] = (float("inf"), None)
            continue
        fits[(float(lr), float(wd))] = (float(nll_of(post)), post)
    return fits


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


def write_seed_table(out: Path, name: str, title: str, columns: list[tuple[str, str]], per_seed: list[dict],
                     notes: list[str], meta: dict) -> str:
    """Write ``name.json`` and ``name.md``: every row and column of ``per_seed`` (one table's rows per seed) as
    mean ± standard error over the seeds (`mean_se`; rows or values missing from a seed are left out of the
    row, with how many seeds it has); return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    labels = [label for label in per_seed[0] if all(label in rows for rows in per_seed)]
    table = {}
    for label in labels:
        table[label] = {}
        for key, _ in columns:
            values = [rows[label].get(key) for rows in per_seed]
            if all(isinstance(v, (int, float)) for v in values):
                table[label][key] = tuple(float(x) for x in mean_se(values))
    head = "| method | " + " | ".join(label for _, label in columns) + " |"
    lines = [f"## {title}", "", head, "|---|" + "---:|" * len(columns)]
    for label, row in table.items():
        cells = ["—" if key not in row else f"{row[key][0]:.3f} ± {row[key][1]:.3f}" for key, _ in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    notes = [f"Mean ± standard error over {len(per_seed)} seeds."] + notes
    lines += [""] + [f"- {n}" for n in notes] + [""]
    md = "\n".join(lines)
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps({"title": title, "columns": dict(columns), "seeds": len(per_seed),
                                                  "mean_se": table, "per_seed": per_seed, "meta": meta}, indent=2,
                                                 default=_jsonable))
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
