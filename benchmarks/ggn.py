#!/usr/bin/env python
"""GGN-vector products of a tanh MLP: ``lo.GGNOp`` against a hand-written jvp → H → vjp.

A 784-128-128-10 tanh MLP (118,282 float32 parameters, a plain per-example ``fn(params, x)`` over a
params dict), 256 random inputs and labels, categorical likelihood. Timed in one process, interleaved:
``ggn-jit`` (``jax.jit(lambda G, v: G @ v)``), ``ggn-lowered`` (``lo.lower(G) @ v``), ``hand`` (the goal's
reference: unravel, ``jax.jvp``, ``p*u - p*(p·u)``, ``jax.vjp``, ravel), and for context the streaming
product (``--stream-batch``), the JVP, the VJP, forward+backward and the forward pass alone. Every product
agrees with ``hand`` (≤ 1e-4) and the JVP / VJP / gradient pass their checks before timing. **Goals: median
per-round GGN / hand ≤ 1.2; temp + output of a GGN product ≤ 1.5× a gradient's.** See ``benchmarks/README.md``.

Run:  python benchmarks/ggn.py            # full run (about 1 minute on 2 cores)
      python benchmarks/ggn.py --quick    # smoke run (seconds; a smaller model and batch)
      python benchmarks/ggn.py --repeats 500 --budget 30   # at most 500 rounds / ~30 s of timing
"""

from __future__ import annotations

import re
import time

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp

import linops as lo
from linops.likelihoods import Categorical
from linops.models import ravel

GOAL_TIME = 1.2  # median per-round GGN / hand
GOAL_MEM = 1.5   # (temp + output) bytes of a GGN product / of a gradient
TOL = 1e-4
METHODS = ("ggn-jit", "ggn-lowered", "ggn-jit-stream", "hand", "jvp", "vjp", "fwd+bwd", "forward")
GGN_METHODS = ("ggn-jit", "ggn-lowered", "ggn-jit-stream")
DESCRIPTIONS = {
    "ggn-jit": "`jax.jit(lambda G, v: G @ v)(G, v)`, `G = lo.GGNOp(..., batch_size=N)`",
    "ggn-lowered": "`lo.lower(G) @ v`",
    "ggn-jit-stream": "as ggn-jit, `batch_size={sb}` (`lax.scan` over {nb} batches; context)",
    "hand": "hand-written jit: unravel, `jax.jvp`, `p*u - p*(p·u)`, `jax.vjp`, ravel (reference)",
    "jvp": "`jax.jvp` of the batched model (context)",
    "vjp": "`jax.vjp` of the batched model, cotangent (N, O) (context)",
    "fwd+bwd": "`jax.grad` of the mean categorical loss (context; memory reference)",
    "forward": "the batched model alone (context)",
}


def categorical_hvp(out, u):
    """``H_n u_n = p*u - p*(p·u)`` per example, ``p = softmax(out_n)``."""
    p = jax.nn.softmax(out, axis=-1)
    return p * u - p * jnp.sum(p * u, axis=-1, keepdims=True)


def reference_functions(fn, unravel):
    """The hand-written programs (plain functions of arrays; jitted by the caller)."""
    f = lambda p, X: H.batched(fn)(p, X)

    def hand(params, X, y, v):
        out, jv = jax.jvp(lambda p: f(p, X), (params,), (unravel(v),))
        _, vjp = jax.vjp(lambda p: f(p, X), params)
        return ravel(vjp(categorical_hvp(out, jv))[0])[0]

    def jvp(params, X, v):
        return jax.jvp(lambda p: f(p, X), (params,), (unravel(v),))[1]

    def vjp(params, X, u):
        return ravel(jax.vjp(lambda p: f(p, X), params)[1](u)[0])[0]

    def fwd_bwd(params, X, y):
        return ravel(jax.grad(lambda p: H.mean_nll(f(p, X), y))(params))[0]

    return hand, jvp, vjp, fwd_bwd, f


def hlo_counts(jitted, *args):
    """``dot`` / ``tanh`` / ``while`` ops in the optimised HLO of the compiled program."""
    text = jitted.lower(*args).compile().as_text()
    return {op: len(re.findall(rf"\b{op}\(", text)) for op in ("dot", "tanh", "while")}


def measure(cfg, timing, log):
    sizes, n, stream_bs = cfg["sizes"], cfg["batch"], cfg["stream_batch"]
    kp, kx, ky, kv, ku = jax.random.split(jax.random.PRNGKey(0), 5)
    params = H.mlp_params(kp, sizes)
    fn = H.mlp_fn(len(sizes) - 1)
    X = jax.random.normal(kx, (n, sizes[0]), jnp.float32)
    y = jax.random.randint(ky, (n,), 0, sizes[-1])
    flat, unravel = ravel(params)
    P = int(flat.shape[0])
    v = jax.random.normal(kv, (P,), jnp.float32)
    u = jax.random.normal(ku, (n, sizes[-1]), jnp.float32)
    log(f"model {'-'.join(map(str, sizes))} tanh MLP, P={P:,} params, batch {n}; stream batch_size={stream_bs}")

    t0 = time.perf_counter()
    G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=n)
    construct_s = time.perf_counter() - t0
    Gs = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=stream_bs) if stream_bs else None
    hand, jvp, vjp, fwd_bwd, forward = map(H.fresh_jit, reference_functions(fn, unravel))
    ggn_apply, ggn_apply_stream = H.fresh_jit(lambda G, v: G @ v), H.fresh_jit(lambda G, v: G @ v)
    t0 = time.perf_counter()
    lowered = lo.lower(G)
    lower_call_s = time.perf_counter() - t0

    # The programs and their arguments (the lowered one's for its compiled-program facts).
    programs = {"ggn-jit": (ggn_apply, (G, v)), "ggn-lowered": (lowered.programs[0], (lowered.leaves, v)),
                "ggn-jit-stream": (ggn_apply_stream, (Gs, v)), "hand": (hand, (params, X, y, v)),
                "jvp": (jvp, (params, X, v)), "vjp": (vjp, (params, X, u)), "fwd+bwd": (fwd_bwd, (params, X, y)),
                "forward": (forward, (params, X))}
    if Gs is None:
        del programs["ggn-jit-stream"]
    methods = [m for m in METHODS if m in programs]
    calls = {m: (lambda f=f, a=a: f(*a)) for m, (f, a) in programs.items()}
    calls["ggn-lowered"] = lambda: lowered @ v

    outs, compile_rep = H.first_calls(calls)  # first calls (compile), then agreement
    compile_rep["ggn-lowered"]["lo.lower_s"] = lower_call_s
    compile_rep["ggn-jit"]["GGNOp_construct_s"] = construct_s
    log("  first calls (s): " + "  ".join(f"{m}={compile_rep[m]['first_call_s']:.3f}" for m in methods))

    checks = {f"{m} vs hand (rel err)": H.rel_err(outs[m], outs["hand"]) for m in methods if m in GGN_METHODS}
    a, b = float(jnp.vdot(u, outs["jvp"])), float(jnp.vdot(outs["vjp"], v))  # <u, J v> = <Jᵀ u, v>
    checks["<u, Jv> vs <J^T u, v> (rel diff)"] = abs(a - b) / max(abs(a), abs(b))
    # The gradient of the mean loss is Jᵀ (softmax(f) - onehot(y)) / N.
    g_out = (jax.nn.softmax(outs["forward"], axis=-1) - jax.nn.one_hot(y, sizes[-1])) / n
    checks["fwd+bwd vs J^T g (rel err)"] = H.rel_err(outs["fwd+bwd"], vjp(params, X, g_out))
    checks["hand vs J^T H J v via jvp, vjp (rel err)"] = H.rel_err(
        outs["hand"], vjp(params, X, categorical_hvp(outs["forward"], outs["jvp"])))
    for what, err in checks.items():
        assert err <= TOL, f"check failed: {what} = {err:.2e} > {TOL}"
    log("  checks: " + "  ".join(f"{k}={e:.1e}" for k, e in checks.items()))

    # A freshly built operator (same fn, arrays and shapes), and one whose params eqx.tree_at replaced.
    t0 = time.perf_counter()
    G_new = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=n)
    compile_rep["ggn-jit"]["GGNOp_rebuild_s"] = time.perf_counter() - t0
    new_params = jax.tree_util.tree_map(lambda p: p * 1.01, params)
    G_swapped = eqx.tree_at(lambda g: g.params, G, new_params)
    rebuild = {"rebuilt GGNOp: ggn-jit": H.first_call(lambda: ggn_apply(G_new, v))[1],
               "rebuilt GGNOp: lo.lower + first product": H.first_call(lambda: lo.lower(G_new) @ v)[1],
               "params swapped with eqx.tree_at: ggn-jit": H.first_call(lambda: ggn_apply(G_swapped, v))[1]}
    swapped_err = H.rel_err(ggn_apply(G_swapped, v), hand(new_params, X, y, v))
    assert swapped_err <= TOL, f"tree_at-swapped GGN disagrees with hand: {swapped_err:.2e}"
    for rep in rebuild.values():
        if rep["n_xla_compiles"] is None and compile_rep["hand"]["n_xla_compiles"] is not None:
            rep["n_xla_compiles"] = 0  # jax.monitoring works here, and reported no compile event

    # Compiled-program facts: memory analysis and op counts (these compile again; no timing).
    memory = {m: H.memory(lambda f=f, a=a: f.lower(*a).compile()) for m, (f, a) in programs.items()}
    counts = {m: hlo_counts(f, *a) for m, (f, a) in programs.items()}
    try:
        program_bytes = lo.memory.program_bytes(G)
    except Exception as e:  # noqa: BLE001
        program_bytes = f"{type(e).__name__}: {e}"
    mem_ratios, mem_ratios_total, ref = {}, {}, memory["fwd+bwd"]
    for m, mm in memory.items():
        if "error" not in mm and "error" not in ref:
            mem_ratios[m] = mm["temp_plus_output"] / ref["temp_plus_output"]
            mem_ratios_total[m] = mm["total"] / ref["total"]

    times, n_rounds = H.rounds(calls, warmup=3, **timing)  # steady state
    med = H.medians(times)
    ratios = {f"{m}/{r}": H.ratio(times, m, r) for r in ("hand", "fwd+bwd") for m in methods}
    goals = {
        "time": {m: {"ratio": f"{m}/hand", "median": ratios[f"{m}/hand"]["median"], "max": GOAL_TIME,
                     "met": ratios[f"{m}/hand"]["median"] <= GOAL_TIME} for m in ("ggn-jit", "ggn-lowered")},
        "memory": {m: {"ratio": f"{m} (temp+output) / fwd+bwd (temp+output)", "value": mem_ratios.get(m),
                       "max": GOAL_MEM, "met": None if m not in mem_ratios else mem_ratios[m] <= GOAL_MEM}
                   for m in ("ggn-jit", "ggn-lowered")},
    }
    log(f"  rounds={n_rounds}  " + "  ".join(f"{m}={med[m] * 1e3:.3f}ms" for m in methods))
    log("  per-round ratios: " + "  ".join(f"{k}={ratios[k]['median']:.3f}" for k in (
        "ggn-jit/hand", "ggn-lowered/hand", "hand/fwd+bwd", "ggn-jit/fwd+bwd", "ggn-lowered/fwd+bwd")))
    log("  memory (temp+output) / fwd+bwd: " + "  ".join(f"{m}={r:.3f}" for m, r in mem_ratios.items()))
    return {
        "model": {"sizes": sizes, "activation": "tanh", "num_params": P, "num_examples": n, "num_outputs": sizes[-1],
                  "likelihood": "Categorical", "ggn_batch_size": n, "stream_batch_size": stream_bs},
        "methods": methods, "rounds": n_rounds, "median_s": med, "min_s": H.minimums(times), "ratios": ratios,
        "goals": goals, "checks": checks, "compile": compile_rep, "rebuilt_operator_first_call": rebuild,
        "memory_analysis": memory, "memory_ratio_vs_fwd_bwd": mem_ratios,
        "memory_ratio_vs_fwd_bwd_with_arguments": mem_ratios_total, "lo.memory.program_bytes(G)": program_bytes,
        "hlo_op_counts": counts,
    }


def _met(g, key, m):
    return f"{'met' if g['met'] else 'NOT met'} for {m} ({g[key]:.3f})"


def _r3(x):
    return "n/a" if x is None else f"{x:.3f}"


def markdown(report) -> str:
    r = report["result"]
    mdl, gt, gm = r["model"], r["goals"]["time"], r["goals"]["memory"]
    sb = mdl["stream_batch_size"]
    nb = -(-mdl["num_examples"] // sb) if sb else 0
    lines = H.head("GGN-vector products", report) + [
        f"Model: {'-'.join(map(str, mdl['sizes']))} tanh MLP ({mdl['num_params']:,} float32 parameters), "
        f"batch {mdl['num_examples']} random inputs, integer labels, categorical likelihood; "
        f"`lo.GGNOp(fn, params, X, y, Categorical(), batch_size={mdl['ggn_batch_size']})`.  ",
        f"**Time goal (median per-round GGN/hand ≤ {GOAL_TIME}): "
        + ", ".join(_met(gt[m], "median", m) for m in gt) + ".**  ",
        f"**Memory goal (temp+output of a GGN product / of a gradient ≤ {GOAL_MEM}): "
        + ", ".join(_met(gm[m], "value", m) for m in gm) + ".**" if gm["ggn-jit"]["value"] is not None
        else "**Memory goal: not measured (no memory analysis on this backend).**",
        *H.section("Steady state (interleaved rounds, median)"),
        f"{r['rounds']} rounds; each round calls every method once (order rotated), each call ending in "
        "`block_until_ready()`. Ratios are medians (IQR) of the per-round ratios.",
        *H.table(("method", "what", "median ms", "min ms", "× hand (IQR)", "× fwd+bwd (IQR)"),
                 [(m, DESCRIPTIONS[m].format(sb=sb, nb=nb), H.ms(r["median_s"][m], 3), H.ms(r["min_s"][m], 3),
                   H.iqr(r["ratios"][f"{m}/hand"]), H.iqr(r["ratios"][f"{m}/fwd+bwd"])) for m in r["methods"]],
                 "llrrrr"),
        *H.table(("goal", "value", "target", "met"),
                 [(f"{m} / hand (time)", f"{gt[m]['median']:.3f}", f"≤ {GOAL_TIME}", H.yes(gt[m]["met"]))
                  for m in gt]
                 + [(f"{m} / fwd+bwd (memory, temp+output)", _r3(gm[m]["value"]), f"≤ {GOAL_MEM}", H.yes(gm[m]["met"]))
                    for m in gm]
                 + [("hand / fwd+bwd (time; context: the issue measured 1.4-1.5)",
                     f"{r['ratios']['hand/fwd+bwd']['median']:.3f}", "", "")], "lrrc"),
        "Checks before timing: " + "; ".join(f"{k} = {v:.1e}" for k, v in r["checks"].items()) + ".",
        *H.section(H.COMPILE),
    ]
    rows = []
    for m in r["methods"]:
        c = r["compile"][m]
        extra = {"ggn-lowered": f" + `lo.lower(G)` {H.s(c.get('lo.lower_s'))}",
                 "ggn-jit": f" (building `lo.GGNOp`: {H.s(c.get('GGNOp_construct_s'))} the first time, "
                            f"{H.s(c.get('GGNOp_rebuild_s'))} again)"}.get(m, "")
        rows.append((m, f"{H.s(c['first_call_s'])} ({H.s(c['trace_s'])} / {H.s(c['lower_s'])} / "
                        f"{H.s(c['xla_compile_s'])}){extra}", c["n_xla_compiles"]))
    lines += [*H.table(("method", "first call (trace / lower / XLA compile)", "XLA compiles"), rows, "llr"), "",
              "After those compiled, first calls with a new operator over the same arrays and shapes:", "",
              *H.table(("case", "first call s", "XLA compiles"),
                       [(k, H.s(c["first_call_s"]), c["n_xla_compiles"])
                        for k, c in r["rebuilt_operator_first_call"].items()]),
              "Operators are keyed by structure (no identity in their static data): a freshly built `GGNOp` "
              "of the same function and shapes reuses the programs compiled for the first, as replacing its "
              "params with `eqx.tree_at` does.",
              *H.section("Memory (XLA memory analysis of each compiled program, MB = 10^6 bytes)")]
    rows = []
    for m in r["methods"]:
        mm = r["memory_analysis"][m]
        rows.append((m, mm["error"], "", "", "", "", "", "") if "error" in mm else (
            m, *(H.mb(mm[k], 3) for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                                         "temp_plus_output")),
            _r3(r["memory_ratio_vs_fwd_bwd"].get(m)), H.mb(mm["total"], 3),
            _r3(r["memory_ratio_vs_fwd_bwd_with_arguments"].get(m))))
    pb = r["lo.memory.program_bytes(G)"]
    lines += [*H.table(("method", "arguments", "output", "temp", "temp + output", "× fwd+bwd (temp + output)",
                        "all three", "× fwd+bwd (all three)"), rows),
              "On CPU this is the compiled program's buffer assignment (what XLA reserves to run it), not a "
              "measured process peak. The goal compares temp + output (what running the program adds); the "
              "arguments differ by `v` itself (P floats), which a GGN product takes and a gradient does not. "
              "`lo.memory.program_bytes(G)` (arguments + output + temp): "
              + (f"{H.mb(pb, 3)} MB." if isinstance(pb, int) else f"{pb}."),
              *H.section("Ops in the optimised HLO of each program"),
              *H.table(("method", "dot", "tanh", "while"),
                       [(m, *r["hlo_op_counts"][m].values()) for m in r["methods"]]),
              "A forward pass of the 3-layer MLP is 3 dots, a JVP adds 5 (tangent products), a VJP 5 "
              "(weight gradients and backpropagated cotangents, none for the input); `jvp` and `vjp` alone "
              "drop the unused last forward dot (7 each). One GGN product needs 13 if the JVP and the VJP "
              "share one forward pass, 16 if it is computed twice."]
    return H.render(lines + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv, repeats=(int, "max interleaved rounds"),
                budget=(float, "target seconds of timing"),
                stream_batch=(int, "batch_size of the streaming context method (0: leave it out)"))
    a = run.args
    cfg = ({"sizes": [64, 32, 32, 10], "batch": 64, "stream_batch": 16} if run.quick
           else {"sizes": [784, 128, 128, 10], "batch": 256, "stream_batch": 64})
    if a.stream_batch is not None:
        cfg["stream_batch"] = a.stream_batch if 0 < a.stream_batch < cfg["batch"] else 0
    repeats = a.repeats or (30 if run.quick else 2000)
    timing = {"max_rounds": repeats, "min_rounds": min(repeats, 10 if run.quick else 100),
              "budget_s": a.budget or (1.0 if run.quick else 75.0)}
    run.log(f"up to {repeats} rounds or ~{timing['budget_s']:.0f}s of timing (at least {timing['min_rounds']})")
    result = measure(cfg, timing, run.log)
    summary = {"time_goal_met": {m: g["met"] for m, g in result["goals"]["time"].items()},
               "memory_goal_met": {m: g["met"] for m, g in result["goals"]["memory"].items()},
               **{k: result["ratios"][k]["median"]
                  for k in ("ggn-jit/hand", "ggn-lowered/hand", "hand/fwd+bwd", "ggn-jit/fwd+bwd")},
               "memory ggn-jit/fwd+bwd": result["memory_ratio_vs_fwd_bwd"].get("ggn-jit")}
    run.write({"goals": {"time": {"ratio": "median per-round GGN / hand", "max": GOAL_TIME},
                         "memory": {"ratio": "(temp + output) of GGN product / of gradient", "max": GOAL_MEM}},
               "summary": summary, "result": result}, markdown)
    run.log(f"time goal (GGN/hand <= {GOAL_TIME}): ggn-jit {summary['ggn-jit/hand']:.3f}, ggn-lowered "
            f"{summary['ggn-lowered/hand']:.3f}; memory goal (<= {GOAL_MEM}): "
            f"{_r3(summary['memory ggn-jit/fwd+bwd'])}")


if __name__ == "__main__":
    main()
