#!/usr/bin/env python
"""Operators applied eagerly (outside ``jax.jit``): ``A @ x`` and ``A.as_matrix()`` as one compiled program per
structure and shape (``compiled``, what the library does) against the operation-by-operation product
(``op-by-op``: ``A.mv(x)`` and ``jax.vmap(A.mv)`` of the identity's columns, what it did before), on the
expressions a test or a notebook builds: a congruence plus a shift, a Kronecker product, a diagonal plus low
rank solved by Woodbury, a projector.

Reported per expression: the first call (XLA compiles and seconds, after `jax.clear_caches`, so each method
starts cold), a second call on a *freshly built* operator of the same structure (compiles: should be 0 for
``compiled``), and the steady time per call (medians of interleaved rounds, and their per-round ratio).
The two methods' results agree (<= 1e-5) before anything is timed.

Run:  python benchmarks/eager.py            # full run (under a minute on 2 cores)
      python benchmarks/eager.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import _harness as H
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo


def expressions(n: int):
    """Builders ``i -> operator`` of one structure on new arrays (``i`` varies the values)."""
    rng = np.random.default_rng(0)
    m = n // 2
    J, M, d = rng.standard_normal((m, n)), rng.standard_normal((n, n)), rng.uniform(1.0, 2.0, m)
    spd = M @ M.T / n + np.eye(n)
    k = int(np.sqrt(n))

    def congruence(i):
        Jo = lo.Dense(jnp.asarray(J * (1 + i), jnp.float32))
        return lo.shift(Jo.T @ lo.Diagonal(jnp.asarray(d, jnp.float32)) @ Jo, 0.1, nonnegative=True)

    def kronecker(i):
        A = lo.Dense(jnp.asarray(spd[:k, :k] + i, jnp.float32))
        return lo.Kronecker(A, lo.Diagonal(jnp.asarray(np.arange(1.0, k + 1), jnp.float32)))

    def woodbury(i):
        D = lo.Diagonal(jnp.asarray(np.linspace(1.0, 2.0, n) + i, jnp.float32))
        return lo.inv(D + lo.LowRank(jnp.asarray(J[:4].T, jnp.float32), jnp.ones(4, jnp.float32)))

    def projector(i):
        return lo.ProjectorOp.onto_null_space(jnp.asarray(J[:8] + i, jnp.float32))

    return {"Jᵀ D J + λI": congruence, "A ⊗ D": kronecker, "(D + U Uᵀ)⁻¹ (Woodbury)": woodbury,
            "null-space projector": projector}


def op_by_op_product(A, v):
    return A.mv(v)


def compiled_product(A, v):
    return A @ v


def op_by_op_dense(A):
    return jax.vmap(A.mv, in_axes=1, out_axes=1)(jnp.eye(A.shape[1], dtype=A.dtype))


def compiled_dense(A):
    return A.as_matrix()


METHODS = {"op-by-op": (op_by_op_product, op_by_op_dense), "compiled": (compiled_product, compiled_dense)}


def run_case(run, name, build, n):
    v = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    checks = H.Checks()
    for what, index in (("product", 0), ("dense", 1)):
        ref = METHODS["op-by-op"][index]
        got = METHODS["compiled"][index]
        args = (build(0), v) if index == 0 else (build(0),)
        checks(f"{name} {what}", H.rel_err(got(*args), ref(*args)), 1e-5)
    if checks.failed:
        raise AssertionError(f"{name}: the two methods disagree: {checks.failed}")
    out = {"checks": checks, "first": {}, "fresh_compiles": {}}
    for method, (product, dense) in METHODS.items():
        jax.clear_caches()
        first, fresh = build(0), build(1)  # built (and their construction compiled) before the clocks start
        both = lambda A, product=product, dense=dense: (product(A, v), dense(A))  # noqa: E731
        _, rep = H.first_call(lambda: both(first))  # noqa: B023 (called here, in this iteration)
        out["first"][method] = rep
        _, again = H.first_call(lambda: both(fresh))  # noqa: B023
        out["fresh_compiles"][method] = again["n_xla_compiles"] or 0
    ops = {method: build(2) for method in METHODS}
    calls = {method: (lambda p=product, A=ops[method]: p(A, v)) for method, (product, _) in METHODS.items()}
    times, rounds = H.rounds(calls, min_rounds=5 if run.quick else 50, budget_s=0.2 if run.quick else 3.0,
                             warmup=1)
    out["steady_s"], out["rounds"] = H.medians(times), rounds
    out["ratio"] = H.ratio(times, "op-by-op", "compiled")
    run.log(f"{name}: first call {out['first']['op-by-op']['n_xla_compiles']} compiles "
            f"{out['first']['op-by-op']['first_call_s']:.2f} s op by op, {out['first']['compiled']['n_xla_compiles']} "
            f"compiles {out['first']['compiled']['first_call_s']:.2f} s compiled; steady ratio "
            f"{out['ratio']['median']:.2f}")
    return out


def markdown(report):
    lines = [*H.head("Operators applied eagerly", report),
             "Both methods run outside `jax.jit`. **op-by-op**: `A.mv(v)` and `jax.vmap(A.mv)` of the identity's "
             "columns, each `jax.numpy` operation its own program (the library before); **compiled**: `A @ v` "
             "and `A.as_matrix()`, one program per structure and shape. First call: product and dense matrix "
             "of an operator built after `jax.clear_caches()` (its construction not counted); fresh operator: "
             f"the same on an operator built anew on new arrays of the same structure. float32, n = {report['n']}."]
    rows = []
    for name, c in report["cases"].items():
        f = c["first"]
        rows.append((name, f["op-by-op"]["n_xla_compiles"], H.s(f["op-by-op"]["first_call_s"]),
                     f["compiled"]["n_xla_compiles"], H.s(f["compiled"]["first_call_s"]),
                     c["fresh_compiles"]["op-by-op"], c["fresh_compiles"]["compiled"],
                     H.ms(c["steady_s"]["op-by-op"], 3), H.ms(c["steady_s"]["compiled"], 3),
                     H.iqr(c["ratio"])))
    lines += H.table(("expression", "first: op-by-op compiles", "s", "first: compiled compiles", "s",
                      "fresh operator: op-by-op compiles", "compiled compiles", "steady op-by-op ms",
                      "steady compiled ms", "op-by-op / compiled (IQR)"), rows)
    return H.render(lines + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    n = 16 if run.quick else 256
    cases = {name: run_case(run, name, build, n) for name, build in expressions(n).items()}
    run.write({"n": n, "cases": cases}, markdown)


if __name__ == "__main__":
    main()
