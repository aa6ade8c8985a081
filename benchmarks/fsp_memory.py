#!/usr/bin/env python
"""FSP-Laplace's memory plan, from XLA's memory analysis of the compiled Laplace step (compiled, not run).

``pst.fsp_laplace`` multiplies the GGN and the context Jacobian by all ``rank`` columns of its factors. Run on
every column at once, a product holds a batch's activations per column; `posteriors.fsp` now runs them in blocks
of columns sized before the run (``_products_plan``). Reported per plan: examples per GGN batch, GGN columns per
block, context points per Jacobian batch, Jacobian columns per block, and the bytes of temporaries XLA reserves
for the whole step, beside one ``(P, rank)`` factor's bytes (the step keeps a few of those whatever the plan).

The network is LeNet-5 at ``size="real"`` (244,362 parameters; ``--quick``: ``size="small"``), 10 classes,
float32, on N random 28x28 images with 100 context points (rank 500 = min(500, 100 x 10)).

Run:  python benchmarks/fsp_memory.py            # N = 3,600 (the projected paper's protocol size; about a minute)
      python benchmarks/fsp_memory.py --quick    # smoke run (not to be read)
"""

from __future__ import annotations

import time

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp

from linops.kernels import RBF
from linops.likelihoods import Categorical
from linops.models import ravel
from posteriors import fsp
from posteriors.experiments.architectures import lenet5


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    size, side, n, n_context = ("small", 12, 200, 10) if run.quick else ("real", 28, 3600, 100)
    fn, params = lenet5(jax.random.key(0), size=size)
    X = jax.random.normal(jax.random.key(1), (n, 1, side, side), jnp.float32)
    Y = jnp.zeros(n, jnp.int32)
    C = jax.random.normal(jax.random.key(2), (n_context, 1, side, side), jnp.float32)
    kernel = fsp._as_prior(RBF(1.0, 10.0), "fsp_memory").kernel_for(10, "fsp_memory")
    rank = min(500, n_context * 10)
    P = int(ravel(params)[0].shape[0])
    plans = {"every column at once, batches of 256 and 50 (before the plan)": (256, rank, 50, rank),
             "planned, batches of 256 and 50": fsp._products_plan(fn, params, X, C, rank, 256, 50),
             "planned, default batches": fsp._products_plan(fn, params, X, C, rank, None, None)}
    rows = []
    for name, plan in plans.items():
        run.log(f"{name}: plan {plan}")
        step = eqx.filter_jit(fsp._algorithm2.__wrapped__)
        args = (fn, params, X, Y, C, kernel, Categorical(), rank, plan, 1e-6, None, None)
        t0 = time.perf_counter()
        compiled = step.lower(*args).compile().compiled
        t = time.perf_counter() - t0
        rows.append({"plan": name, "batch": plan[0], "columns": plan[1], "context_batch": plan[2],
                     "context_columns": plan[3], "compile_s": t, "memory": H.memory(compiled)})
        run.log(f"  temporaries {H.mb(rows[-1]['memory'].get('temp_size_in_bytes', 0))} MB, compiled in {t:.1f}s")
    run.write({"num_params": P, "num_examples": n, "num_context": n_context, "rank": rank,
               "factor_bytes": P * rank * 4, "activations_per_example": fsp._activations(fn, params, C[0]),
               "rows": rows}, markdown)


def markdown(report):
    rows = [(r["plan"], r["batch"], r["columns"], r["context_batch"], r["context_columns"],
             H.mb(r["memory"].get("temp_size_in_bytes", 0)), f"{r['compile_s']:.1f}") for r in report["rows"]]
    return H.render([
        *H.head("FSP-Laplace's memory plan", report),
        "",
        f"LeNet-5, {report['num_params']:,} parameters, {report['num_examples']:,} images, "
        f"{report['num_context']} context points, rank {report['rank']}; one example's activations: "
        f"{report['activations_per_example']:,} numbers; one (P, rank) float32 factor: "
        f"{H.mb(report['factor_bytes'])} MB. XLA's memory analysis of the compiled step (not run).",
        *H.table(("plan", "GGN batch", "GGN columns per block", "context batch", "Jacobian columns per block",
                  "temporaries (MB)", "compile (s)"), rows),
        *H.machine(report),
    ])


if __name__ == "__main__":
    main()
