#!/usr/bin/env python
"""What `AlternatingProjectionOp`'s ``precision="highest"`` (its default) costs against ``precision=None`` (the
precision in effect, JAX's default): the issue-38 CNN's projector (124,814 parameters, 28 x 28 inputs) on 200
images in batches of 50, with its rows stored and with its linearisation stored; the same number of sweeps for
both (the plain method, 10 sweeps, of a block of 10 vectors), timed in interleaved rounds, and the two
projections compared.

On a CPU, float32 products are computed in full whatever precision is asked, so the two should cost the same
and agree; on a GPU, JAX's default float32 products are TF32, the projection's CG stalls on them
(`docs/methods/projected.md`), and this measures what full products cost there.

Run:  python benchmarks/projection_precision.py            # full run (about 5 minutes on 2 cores)
      python benchmarks/projection_precision.py --quick    # smoke run (about 30 s)
"""

from __future__ import annotations

import time

import _harness as H
import jax
import jax.numpy as jnp
import numpy as np
from projected import _CNN

import linops as lo
from linops.models import from_equinox, ravel

PRECISIONS = {"highest": "highest", "in effect": None}
STORAGES = {"rows": "rows", "linearization": True}


def run_case(storage, fn, params, X, V, timing, log):
    ops, build = {}, {}
    for label, precision in PRECISIONS.items():
        t = time.perf_counter()
        ops[label] = lo.AlternatingProjectionOp.from_jacobian(
            fn, params, X, batch_size=X.shape[0] // 4, store_linearization=STORAGES[storage], method="plain",
            max_sweeps=10, rtol=0.0, precision=precision)
        jax.block_until_ready(ops[label].W)
        build[label] = time.perf_counter() - t  # with its compilation
    calls = {label: (lambda A=A: A.project_samples(V).value) for label, A in ops.items()}
    values = {label: np.asarray(call()) for label, call in calls.items()}  # compiles; also the agreement check
    times, rounds = H.rounds(calls, **timing)
    med = H.medians(times)
    case = {"storage": storage, "rounds": rounds, "build_s": build, "median_s": med,
            "ratio_highest_over_in_effect": H.ratio(times, "highest", "in effect"),
            "relative_difference": H.rel_err(values["highest"], values["in effect"])}
    log(f"{storage}: highest {med['highest']:.3f} s, in effect {med['in effect']:.3f} s per 10 sweeps of "
        f"{V.shape[1]} vectors; ratio {case['ratio_highest_over_in_effect']['median']:.3f}; relative difference "
        f"{case['relative_difference']:.1e}")
    return case


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    size, hidden, n = (8, 8, 20) if run.quick else (28, 76, 200)
    fn, params = from_equinox(_CNN(jax.random.key(2), size, hidden))
    X = jax.random.uniform(jax.random.key(0), (n, 1, size, size), jnp.float32)
    P = ravel(params)[0].size
    V = jax.random.normal(jax.random.key(1), (P, 10), jnp.float32)
    run.log(f"{P:,} parameters, {n} images in batches of {n // 4}, {jax.default_backend()}; default precision "
            f"{jax.config.jax_default_matmul_precision}")
    timing = {"min_rounds": 2 if run.quick else 5, "max_rounds": 2 if run.quick else 9,
              "budget_s": 0.0 if run.quick else 60.0}
    cases = [run_case(storage, fn, params, X, V, timing, run.log) for storage in STORAGES]
    run.write({"problem": {"params": int(P), "images": n, "batch_size": n // 4, "vectors": V.shape[1], "sweeps": 10,
                           "default_matmul_precision": jax.config.jax_default_matmul_precision},
               "cases": cases}, markdown)


def markdown(report) -> str:
    p = report["problem"]
    return H.render(H.head("The projector's precision", report) + [
        f"A CNN of {p['params']:,} parameters (`benchmarks/projected.py`'s), {p['images']} images in batches of "
        f"{p['batch_size']}: {p['sweeps']} plain sweeps of a block of {p['vectors']} vectors, "
        "`AlternatingProjectionOp(precision=\"highest\")` (the default) against `precision=None` (the precision "
        f"in effect: `jax_default_matmul_precision` = {p['default_matmul_precision']}, JAX's default), in "
        "interleaved rounds (medians). The build includes its compilation.",
        *H.table(("stored", "rounds", "highest s", "in effect s", "highest / in effect (IQR)",
                  "build s: highest / in effect", "relative difference"),
                 [(c["storage"], c["rounds"], H.s(c["median_s"]["highest"]), H.s(c["median_s"]["in effect"]),
                   H.iqr(c["ratio_highest_over_in_effect"]),
                   f"{c['build_s']['highest']:.1f} / {c['build_s']['in effect']:.1f}",
                   f"{c['relative_difference']:.1e}") for c in report["cases"]]),
        *H.machine(report)])


if __name__ == "__main__":
    main()
