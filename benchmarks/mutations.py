#!/usr/bin/env python
"""A mutation check of the core math: one-line changes to the formulas, each of which must fail the tests.

Each mutant replaces one exact line of the library (refused if that line is not found once: the script
must be updated with the code) in a copy of the tracked files, and runs the tests that should catch it
(``pytest -x -n 0`` in that copy, JAX's default optimisation level off as in the suite). A mutant is
*caught* when the tests fail, *survived* when they pass. The unmutated copy runs the same tests first and
must pass (otherwise no verdict is drawn). The first four are the mutants issue 37 found surviving (the
Woodbury log-determinant twice, CG trusting its recursive residual, Lanczos keeping the recurrence's
residuals after a restart); the others guard formulas every posterior rests on.

Run:  python benchmarks/mutations.py           # about 5 minutes on 2 cores
      python benchmarks/mutations.py --quick   # every mutated line still found; the CG mutant run (CI)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _harness as H

ROOT = Path(__file__).resolve().parent.parent

# (name, file, line as it is, line as mutated, tests that must fail, what the mutant breaks)
MUTANTS = [
    ("woodbury: drop log|D|", "linops/algebra/_woodbury.py",
     "    return log_det_D + jnp.linalg.slogdet(K)[1]",
     "    return jnp.linalg.slogdet(K)[1]",
     ["tests/linops/test_woodbury.py"], "the determinant lemma without the base's log-determinant"),
    ("woodbury: shift multiplicity", "linops/algebra/_woodbury.py",
     "        return jnp.sum(jnp.log(jnp.abs(c + d))) + (n - U.shape[1]) * jnp.log(jnp.abs(c))",
     "        return jnp.sum(jnp.log(jnp.abs(c + d))) + n * jnp.log(jnp.abs(c))",
     ["tests/linops/test_woodbury.py"], "an orthonormal shift's eigenvalue c counted n times, not n - k"),
    ("cg: trust the recursive residual", "linops/algebra/_cg.py",
     "    converged = (recursive <= threshold) & (res <= 10 * threshold) & jnp.all(jnp.isfinite(x), axis=0)",
     "    converged = (recursive <= threshold) & jnp.all(jnp.isfinite(x), axis=0)",
     ["tests/linops/test_functions.py::test_cg_reports_converged_only_when_the_true_residual_meets_the_tolerance"],
     "converged although the recomputed residual misses the tolerance"),
    ("lanczos: ritz(A) keeps the recurrence", "linops/numerics/_lanczos.py",
     "            residuals = lax.cond(unmeasured, lambda: _true_residuals(A, U, w), lambda: residuals)",
     "            residuals = residuals",
     ["tests/linops/test_lanczos.py"], "Ritz residuals read from the recurrence after a restart or below rounding"),
    ("cholesky: half the log-determinant", "linops/algebra/_factorizations.py",
     "    return 2.0 * closed_forms.logdet(op.factor)",
     "    return closed_forms.logdet(op.factor)",
     ["tests/linops/test_factorizations.py"], "log det L L^T read as log det L"),
    ("evidence: the prior's log-determinant", "posteriors/marglik.py",
     "    return -loss - 0.5 * jnp.sum(alpha * theta**2) + 0.5 * log_prior_det - 0.5 * logdet(alpha, scale)",
     "    return -loss - 0.5 * jnp.sum(alpha * theta**2) + log_prior_det - 0.5 * logdet(alpha, scale)",
     ["tests/posteriors/test_laplace.py::test_prior_and_noise_tuning_find_the_exact_evidence_maximiser"],
     "the log evidence with log det(alpha I) not halved"),
    ("categorical: the Hessian factor transposed", "linops/likelihoods/_base.py",
     "        return jnp.diag(s) - jnp.outer(s, p)",
     "        return jnp.diag(s) - jnp.outer(p, s)",
     ["tests/linops/test_nn.py::test_likelihood_closed_forms_match_autodiff"],
     "a factor A with A^T A != diag(p) - p p^T"),
    ("diagonal GGN: unsquared output gradients", "linops/nn/_layer_diag.py",
     "                    weights.append(jnp.sum(g[..., 0] ** 2, axis=0))  # (G, out); times a^2 per batch",
     "                    weights.append(jnp.sum(jnp.abs(g[..., 0]), axis=0))  # (G, out); times a^2 per batch",
     ["tests/linops/test_layer_diag.py"], "a dense layer's diagonal from |g| instead of g^2"),
    ("kfac-reduce: summed, not averaged, activations", "linops/nn/_kfac.py",
     "                a = a.mean(-1)  # (b, G, in)",
     "                a = a.sum(-1)  # (b, G, in)",
     ["tests/linops/test_kfac.py::test_expand_is_exact_per_token_and_reduce_exact_when_pooled_for_a_linear_gaussian_model"],
     "KFAC-reduce's activation factor scaled by the positions squared"),
]
QUICK = ["cg: trust the recursive residual"]


def tracked_copy(dest: Path) -> None:
    """The repository's tracked files (as they are in the working tree) copied under ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def mutate(root: Path, file: str, old: str, new: str) -> None:
    path = root / file
    lines = path.read_text().split("\n")
    hits = [i for i, line in enumerate(lines) if line == old]
    if len(hits) != 1:
        raise SystemExit(f"mutations: {file} holds the line to mutate {len(hits)} times (expected once): update "
                         f"the script with the code\n  {old!r}")
    lines[hits[0]] = new
    path.write_text("\n".join(lines))


def run_tests(root: Path, tests) -> tuple[bool, float, str]:
    """``(passed, seconds, last lines of pytest's output)`` of ``tests`` in the copy at ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-W", "ignore", *tests], cwd=root, env=env, capture_output=True, text=True)
    tail = [line for line in proc.stdout.strip().split("\n") if line][-1:]
    return proc.returncode == 0, time.perf_counter() - t, " ".join(tail)


def markdown(report) -> str:
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731 - a pipe in a table cell
    rows = "\n".join(f"| {cell(m['name'])} | `{m['file']}` | {cell(m['breaks'])} | "
                     f"{', '.join(f'`{t}`' for t in m['tests'])} | "
                     f"{'**caught**' if m['caught'] else '**SURVIVED**'} ({m['seconds']:.0f} s) |"
                     for m in report["mutants"])
    caught = sum(m["caught"] for m in report["mutants"])
    return (f"# Mutation check of the core math (`{report['command']}`)\n\n"
            f"Each mutant changes one line of the library in a copy of the tracked files; the tests named must "
            f"fail. The unmutated copy passed the same tests first ({report['baseline_s']:.0f} s).\n\n"
            f"**{caught} of {len(report['mutants'])} mutants caught.**\n\n"
            "| mutant | file | what it breaks | tests | verdict |\n|---|---|---|---|---|\n" + rows + "\n")


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    chosen = [m for m in MUTANTS if not run.quick or m[0] in QUICK]
    with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
        base = Path(tmp) / "base"
        tracked_copy(base)
        for _, file, old, new, _, _ in MUTANTS:  # every line is found once before anything runs (--quick too)
            text = (base / file).read_text().split("\n")
            if text.count(old) != 1:
                mutate(base, file, old, new)  # raises with the reason
        tests = sorted({t for m in chosen for t in m[4]})
        ok, baseline_s, tail = run_tests(base, tests)
        run.log(f"unmutated: {'passed' if ok else 'FAILED'} in {baseline_s:.0f} s ({tail})")
        if not ok:
            raise SystemExit("mutations: the unmutated tests fail; no verdict")
        results = []
        for name, file, old, new, tests, breaks in chosen:
            copy = Path(tmp) / "mutant"
            shutil.copytree(base, copy)
            mutate(copy, file, old, new)
            passed, seconds, tail = run_tests(copy, tests)
            shutil.rmtree(copy)
            results.append({"name": name, "file": file, "tests": tests, "breaks": breaks, "caught": not passed,
                            "seconds": seconds, "pytest": tail})
            run.log(f"{name}: {'caught' if not passed else 'SURVIVED'} in {seconds:.0f} s ({tail})")
    report = run.write({"baseline_s": baseline_s, "mutants": results}, markdown)
    survived = [m["name"] for m in report["mutants"] if not m["caught"]]
    if survived:
        raise SystemExit(f"mutations: survived: {survived}")


if __name__ == "__main__":
    main()
