#!/usr/bin/env python
"""Random draws compiled as XLA:CPU compiles them at JAX's default optimisation level: a `jax.random` draw of a
multi-dimensional shape (``shaped``, ``jax.random.normal(key, (n, d))``) against the same draw made flat and
reshaped (``flat``, `linops.runtime.flat_draw`, what the library does for its samples and probes; the test suite's
data does the same through ``tests/_draws.py``).

Reported per shape and sampler: XLA's compile seconds of the draw's program alone and inside a product with a
matrix (as a sample meets a square-root factor), medians of interleaved rounds, each after
`jax.clear_caches`, and their ratio. The two methods' values are checked equal, bit for bit, before anything is
timed.

Run:  python benchmarks/draws.py            # full run (about two minutes on 2 cores)
      python benchmarks/draws.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import time

import _harness as H
import jax
import jax.numpy as jnp
import numpy as np

from linops.runtime import flat_draw

SAMPLERS = {"normal": jax.random.normal, "uniform": jax.random.uniform}


def programs(sampler, shape):
    """``{method: {context: function of a key}}``."""
    draw = SAMPLERS[sampler]
    left = jnp.ones((4, shape[0]), jnp.float32)
    shaped = lambda k: draw(k, shape, jnp.float32)  # noqa: E731
    flat = lambda k: flat_draw(draw, k, shape, jnp.float32)  # noqa: E731
    return {"shaped": {"alone": shaped, "in a product": lambda k: jnp.tensordot(left, shaped(k), 1)},
            "flat": {"alone": flat, "in a product": lambda k: jnp.tensordot(left, flat(k), 1)}}


def compile_seconds(fn, key):
    jax.clear_caches()
    lowered = jax.jit(fn).lower(key)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def run_case(run, sampler, shape, rounds):
    key = jax.random.key(0)
    progs = programs(sampler, shape)
    for context in ("alone", "in a product"):
        a, b = (np.asarray(jax.jit(progs[m][context])(key)) for m in ("shaped", "flat"))
        if not np.array_equal(a, b):
            raise AssertionError(f"{sampler} {shape} {context}: the flat draw's values differ from the shaped draw's")
    out = {}
    for context in ("alone", "in a product"):
        times = {"shaped": [], "flat": []}
        for r in range(rounds):  # interleaved, alternating which goes first
            for method in (("shaped", "flat") if r % 2 == 0 else ("flat", "shaped")):
                times[method].append(compile_seconds(progs[method][context], key))
        out[context] = {"compile_s": H.medians(times), "ratio": H.ratio(times, "shaped", "flat")}
        run.log(f"{sampler} {shape} {context}: shaped {out[context]['compile_s']['shaped']:.2f} s, flat "
                f"{out[context]['compile_s']['flat']:.2f} s (ratio {out[context]['ratio']['median']:.1f})")
    return out


def markdown(report):
    lines = [*H.head("Random draws: shaped against flat", report),
             "XLA's compile seconds (`Lowered.compile`, after `jax.clear_caches`) of a float32 `jax.random` draw of "
             "the shape given (**shaped**) and of the same draw made flat and reshaped (**flat**, "
             "`linops.runtime.flat_draw`: equal values, checked bit for bit), alone and inside a product with a "
             f"(4, n) matrix; medians of {report['rounds']} interleaved rounds."]
    rows = []
    for name, c in report["cases"].items():
        for context, r in c.items():
            rows.append((name, context, H.s(r["compile_s"]["shaped"]), H.s(r["compile_s"]["flat"]), H.iqr(r["ratio"])))
    lines += H.table(("draw", "program", "shaped s", "flat s", "shaped / flat (IQR)"), rows)
    return H.render(lines + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    shapes = [(63, 10)] if run.quick else [(63, 10), (256, 100), (1000, 20), (32, 3, 3, 16)]
    rounds = 1 if run.quick else 5
    cases = {f"{sampler} {shape}": run_case(run, sampler, shape, rounds)
             for sampler in (("normal",) if run.quick else SAMPLERS) for shape in shapes}
    run.write({"rounds": rounds, "cases": cases}, markdown)


if __name__ == "__main__":
    main()
