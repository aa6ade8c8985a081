#!/usr/bin/env python
"""GGN-vector products of a tanh MLP: ``lo.GGNOp`` against a hand-written jvp → H → vjp.

The model is a 784-128-128-10 tanh MLP (118,282 float32 parameters, written as a plain
per-example ``fn(params, x) -> (10,)`` over a params dict), the data 256 random inputs and
integer labels in [0, 10), the likelihood categorical. In one process and on the same
arrays, interleaved:

  ``ggn-jit``      ``jax.jit(lambda G, v: G @ v)(G, v)`` with
                   ``G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=256)``;
  ``ggn-lowered``  ``lo.lower(G) @ v``;
  ``hand``         a ``jax.jit`` function of ``(params, X, y, v)``: unravel ``v``, ``jax.jvp``
                   of the batched model, the categorical output Hessian ``p*u - p*(p·u)``,
                   ``jax.vjp``, ravel (the goal's reference);

and, for context, ``ggn-jit`` with a smaller ``batch_size`` (``--stream-batch``, the
streaming path: a ``lax.scan`` over batches), the JVP alone, the VJP alone, the forward
pass alone, and forward+backward (``jax.grad`` of the mean categorical loss).

All GGN products are checked to agree with ``hand`` (relative error <= 1e-4), the JVP and
VJP to pass a dot-product test, and the gradient to equal the VJP of the loss's output
gradient, before anything is timed. Reported: the median time of each method, the median
(and IQR) of the per-round ratios ``GGN / hand`` (**goal <= 1.2**) and ``X / fwd+bwd``;
compile time (first call, split into trace / lowering / XLA compile from ``jax.monitoring``);
whether a rebuilt operator recompiles; XLA's memory analysis of each compiled program, with
``temp + output`` of a GGN product against that of a gradient (**goal <= 1.5**); and the
``dot`` / ``tanh`` ops in each compiled program (a second forward pass would show there).

Run:  python benchmarks/ggn.py            # full run (about 1 minute on 2 cores)
      python benchmarks/ggn.py --quick    # smoke run (seconds; a smaller model and batch)
      python benchmarks/ggn.py --out DIR  # write DIR/ggn.json and DIR/ggn.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Categorical
from linops.models import ravel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import CompileEvents, _ratio, _s, fresh_jit, machine_info, rel_err  # noqa: E402

GOAL_TIME = 1.2  # median per-round GGN / hand
GOAL_MEM = 1.5   # (temp + output) bytes of a GGN product / of a gradient
TOL = 1e-4

METHODS = ("ggn-jit", "ggn-lowered", "ggn-jit-stream", "hand", "jvp", "vjp", "fwd+bwd", "forward")
GGN_METHODS = ("ggn-jit", "ggn-lowered", "ggn-jit-stream")


# --- problem -----------------------------------------------------------------------------


def init_params(key, sizes):
    """``{"W0", "b0", ...}``: ``W_i`` of shape ``(in, out)``, scaled by ``1/sqrt(in)``."""
    keys = jax.random.split(key, len(sizes) - 1)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        params[f"W{i}"] = jax.random.normal(keys[i], (a, b), jnp.float32) / np.sqrt(a)
        params[f"b{i}"] = 0.1 * jax.random.normal(jax.random.fold_in(keys[i], 1), (b,), jnp.float32)
    return params


def make_mlp(num_layers: int):
    """The per-example model ``fn(params, x) -> (O,)``: tanh hidden layers, linear output."""

    def fn(params, x):
        h = x
        for i in range(num_layers):
            h = h @ params[f"W{i}"] + params[f"b{i}"]
            if i < num_layers - 1:
                h = jnp.tanh(h)
        return h

    return fn


def batched(fn):
    return jax.vmap(fn, in_axes=(None, 0))


def categorical_hvp(out, u):
    """``H_n u_n = p*u - p*(p·u)`` per example, ``p = softmax(out_n)``."""
    p = jax.nn.softmax(out, axis=-1)
    return p * u - p * jnp.sum(p * u, axis=-1, keepdims=True)


def make_reference_functions(fn, unravel):
    """The hand-written programs (plain functions of arrays; jitted by the caller)."""

    def hand(params, X, y, v):
        t = unravel(v)
        f = lambda p: batched(fn)(p, X)
        out, jv = jax.jvp(f, (params,), (t,))
        _, vjp = jax.vjp(f, params)
        return ravel(vjp(categorical_hvp(out, jv))[0])[0]

    def jvp(params, X, v):
        return jax.jvp(lambda p: batched(fn)(p, X), (params,), (unravel(v),))[1]

    def vjp(params, X, u):
        _, pullback = jax.vjp(lambda p: batched(fn)(p, X), params)
        return ravel(pullback(u)[0])[0]

    def fwd_bwd(params, X, y):
        def loss(p):
            out = batched(fn)(p, X)
            nll = jax.nn.logsumexp(out, axis=-1) - jnp.take_along_axis(out, y[:, None], axis=1)[:, 0]
            return jnp.mean(nll)

        return ravel(jax.grad(loss)(params))[0]

    def forward(params, X):
        return batched(fn)(params, X)

    return hand, jvp, vjp, fwd_bwd, forward


# --- compiled-program facts --------------------------------------------------------------


def memory_of(jitted, *args):
    """XLA's memory analysis of the compiled program (bytes), or None where unavailable."""
    try:
        compiled = jitted.lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - report, do not fail the benchmark
        return {"error": f"{type(e).__name__}: {e}"}
    return memory_report(compiled)


def memory_report(compiled):
    """XLA's memory analysis of an already compiled program (bytes): the keys of `memory_of`."""
    try:
        analysis = compiled.memory_analysis()
    except Exception as e:  # noqa: BLE001 - report, do not fail the benchmark
        return {"error": f"{type(e).__name__}: {e}"}
    if analysis is None:
        return {"error": "memory_analysis() returned None on this backend"}
    rep = {k: int(getattr(analysis, k)) for k in (
        "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes",
        "generated_code_size_in_bytes")}
    rep["temp_plus_output"] = rep["temp_size_in_bytes"] + rep["output_size_in_bytes"]
    rep["total"] = rep["temp_plus_output"] + rep["argument_size_in_bytes"]
    return rep


def hlo_counts(jitted, *args):
    """``dot`` / ``tanh`` / ``while`` ops in the optimised HLO of the compiled program."""
    text = jitted.lower(*args).compile().as_text()
    return {op: len(re.findall(rf"\b{op}\(", text)) for op in ("dot", "tanh", "while")}


# --- timing ------------------------------------------------------------------------------


def interleaved(calls, *, repeats, min_repeats, budget_s):
    """Rounds calling every method once (order rotated each round), gc off; seconds per call."""
    t0 = time.perf_counter()
    for _ in range(3):
        for fn in calls.values():
            jax.block_until_ready(fn())
    round_s = (time.perf_counter() - t0) / 3
    n_rounds = int(max(min_repeats, min(repeats, budget_s / max(round_s, 1e-9))))

    names = list(calls)
    times = {name: [] for name in names}
    perf = time.perf_counter
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(n_rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                fn = calls[name]
                t = perf()
                jax.block_until_ready(fn())
                times[name].append(perf() - t)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times, n_rounds


def ratio_stats(times, num, den):
    r = np.asarray(times[num]) / np.asarray(times[den])
    return {"median": float(np.median(r)), "p25": float(np.percentile(r, 25)),
            "p75": float(np.percentile(r, 75))}


# --- the benchmark -----------------------------------------------------------------------


def run(cfg, *, repeats, min_repeats, budget_s, events, log):
    sizes, n, stream_bs = cfg["sizes"], cfg["batch"], cfg["stream_batch"]
    kp, kx, ky, kv, ku = jax.random.split(jax.random.PRNGKey(0), 5)
    params = init_params(kp, sizes)
    fn = make_mlp(len(sizes) - 1)
    X = jax.random.normal(kx, (n, sizes[0]), jnp.float32)
    y = jax.random.randint(ky, (n,), 0, sizes[-1])
    flat, unravel = ravel(params)
    P = int(flat.shape[0])
    v = jax.random.normal(kv, (P,), jnp.float32)
    u = jax.random.normal(ku, (n, sizes[-1]), jnp.float32)
    log(f"model {'-'.join(map(str, sizes))} tanh MLP, P={P:,} params, batch {n}; "
        f"stream batch_size={stream_bs}")

    t0 = time.perf_counter()
    G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=n)
    construct_s = time.perf_counter() - t0
    Gs = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=stream_bs) if stream_bs else None

    hand_f, jvp_f, vjp_f, fwd_bwd_f, forward_f = make_reference_functions(fn, unravel)
    ggn_apply = fresh_jit(lambda G, v: G @ v)
    ggn_apply_stream = fresh_jit(lambda G, v: G @ v)
    hand, jvp, vjp = fresh_jit(hand_f), fresh_jit(jvp_f), fresh_jit(vjp_f)
    fwd_bwd, forward = fresh_jit(fwd_bwd_f), fresh_jit(forward_f)

    t0 = time.perf_counter()
    lowered = lo.lower(G)
    lower_call_s = time.perf_counter() - t0

    calls = {
        "ggn-jit": lambda: ggn_apply(G, v),
        "ggn-lowered": lambda: lowered @ v,
        "ggn-jit-stream": lambda: ggn_apply_stream(Gs, v),
        "hand": lambda: hand(params, X, y, v),
        "jvp": lambda: jvp(params, X, v),
        "vjp": lambda: vjp(params, X, u),
        "fwd+bwd": lambda: fwd_bwd(params, X, y),
        "forward": lambda: forward(params, X),
    }
    if Gs is None:
        del calls["ggn-jit-stream"]
    methods = [m for m in METHODS if m in calls]

    # First calls (compile), then agreement.
    compile_rep, outs = {}, {}
    for name in methods:
        outs[name], compile_rep[name] = events.measure(calls[name])
    compile_rep["ggn-lowered"]["lo.lower_s"] = lower_call_s
    compile_rep["ggn-jit"]["GGNOp_construct_s"] = construct_s
    log("  first calls (s): " + "  ".join(f"{m}={compile_rep[m]['first_call_s']:.3f}" for m in methods))

    checks = {f"{m} vs hand (rel err)": rel_err(outs[m], outs["hand"]) for m in methods if m in GGN_METHODS}
    # Dot-product test: <u, J v> = <Jᵀ u, v>.
    a = float(jnp.vdot(u, outs["jvp"]))
    b = float(jnp.vdot(outs["vjp"], v))
    checks["<u, Jv> vs <J^T u, v> (rel diff)"] = abs(a - b) / max(abs(a), abs(b))
    # The gradient of the mean loss is Jᵀ (softmax(f) - onehot(y)) / N.
    g_out = (jax.nn.softmax(outs["forward"], axis=-1) - jax.nn.one_hot(y, sizes[-1])) / n
    checks["fwd+bwd vs J^T g (rel err)"] = rel_err(outs["fwd+bwd"], vjp(params, X, g_out))
    # The hand-written GGN against its definition with the jvp / vjp programs above.
    checks["hand vs J^T H J v via jvp, vjp (rel err)"] = rel_err(
        outs["hand"], vjp(params, X, categorical_hvp(outs["forward"], outs["jvp"])))
    for what, err in checks.items():
        assert err <= TOL, f"check failed: {what} = {err:.2e} > {TOL}"
    log("  checks: " + "  ".join(f"{k}={e:.1e}" for k, e in checks.items()))

    # Does a freshly built operator (same fn, arrays and shapes) reuse the compiled program?
    # And an operator whose params were replaced with equinox.tree_at (the same structure)?
    t0 = time.perf_counter()
    G_new = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=n)
    compile_rep["ggn-jit"]["GGNOp_rebuild_s"] = time.perf_counter() - t0
    new_params = jax.tree_util.tree_map(lambda p: p * 1.01, params)
    G_swapped = eqx.tree_at(lambda g: g.params, G, new_params)
    _, rebuilt_jit = events.measure(lambda: ggn_apply(G_new, v))
    _, rebuilt_lowered = events.measure(lambda: lo.lower(G_new) @ v)
    _, swapped_jit = events.measure(lambda: ggn_apply(G_swapped, v))
    swapped_err = rel_err(ggn_apply(G_swapped, v), hand(new_params, X, y, v))
    assert swapped_err <= TOL, f"tree_at-swapped GGN disagrees with hand: {swapped_err:.2e}"
    for rep in (rebuilt_jit, rebuilt_lowered, swapped_jit):
        if rep["n_xla_compiles"] is None and compile_rep["hand"]["n_xla_compiles"] is not None:
            rep["n_xla_compiles"] = 0  # jax.monitoring works here, and reported no compile event
    rebuild = {"rebuilt GGNOp: ggn-jit": rebuilt_jit, "rebuilt GGNOp: lo.lower + first product": rebuilt_lowered,
               "params swapped with eqx.tree_at: ggn-jit": swapped_jit}

    # Compiled-program facts: memory analysis and op counts (these compile again; no timing).
    program_args = {
        "ggn-jit": (ggn_apply, (G, v)),
        "ggn-lowered": (lowered.programs[0], (lowered.leaves, v)),
        "ggn-jit-stream": (ggn_apply_stream, (Gs, v)),
        "hand": (hand, (params, X, y, v)),
        "jvp": (jvp, (params, X, v)),
        "vjp": (vjp, (params, X, u)),
        "fwd+bwd": (fwd_bwd, (params, X, y)),
        "forward": (forward, (params, X)),
    }
    memory = {m: memory_of(f, *args) for m, (f, args) in program_args.items() if m in calls}
    counts = {m: hlo_counts(f, *args) for m, (f, args) in program_args.items() if m in calls}
    try:
        program_bytes = lo.memory.program_bytes(G)
    except Exception as e:  # noqa: BLE001
        program_bytes = f"{type(e).__name__}: {e}"
    mem_ratios, mem_ratios_total = {}, {}
    if "error" not in memory["fwd+bwd"]:
        ref, ref_total = memory["fwd+bwd"]["temp_plus_output"], memory["fwd+bwd"]["total"]
        for m in memory:
            if "error" not in memory[m]:
                mem_ratios[m] = memory[m]["temp_plus_output"] / ref
                mem_ratios_total[m] = memory[m]["total"] / ref_total

    # Steady state.
    times, n_rounds = interleaved(calls, repeats=repeats, min_repeats=min_repeats, budget_s=budget_s)
    med = {m: statistics.median(times[m]) for m in methods}
    ratios = {f"{m}/hand": ratio_stats(times, m, "hand") for m in methods}
    ratios.update({f"{m}/fwd+bwd": ratio_stats(times, m, "fwd+bwd") for m in methods})

    goals = {
        "time": {m: {"ratio": f"{m}/hand", "median": ratios[f"{m}/hand"]["median"],
                     "max": GOAL_TIME, "met": ratios[f"{m}/hand"]["median"] <= GOAL_TIME}
                 for m in ("ggn-jit", "ggn-lowered")},
        "memory": {m: {"ratio": f"{m} (temp+output) / fwd+bwd (temp+output)", "value": mem_ratios.get(m),
                       "max": GOAL_MEM, "met": None if m not in mem_ratios else mem_ratios[m] <= GOAL_MEM}
                   for m in ("ggn-jit", "ggn-lowered")},
    }
    log(f"  rounds={n_rounds}  " + "  ".join(f"{m}={med[m] * 1e3:.3f}ms" for m in methods))
    log("  per-round ratios: " + "  ".join(
        f"{k}={ratios[k]['median']:.3f}" for k in
        ("ggn-jit/hand", "ggn-lowered/hand", "hand/fwd+bwd", "ggn-jit/fwd+bwd", "ggn-lowered/fwd+bwd")))
    log("  memory (temp+output) / fwd+bwd: " + "  ".join(f"{m}={r:.3f}" for m, r in mem_ratios.items()))

    return {
        "model": {"sizes": sizes, "activation": "tanh", "num_params": P, "num_examples": n,
                  "num_outputs": sizes[-1], "likelihood": "Categorical", "ggn_batch_size": n,
                  "stream_batch_size": stream_bs},
        "methods": methods,
        "rounds": n_rounds,
        "median_s": med,
        "min_s": {m: min(times[m]) for m in methods},
        "ratios": ratios,
        "goals": goals,
        "checks": checks,
        "compile": compile_rep,
        "rebuilt_operator_first_call": rebuild,
        "memory_analysis": memory,
        "memory_ratio_vs_fwd_bwd": mem_ratios,
        "memory_ratio_vs_fwd_bwd_with_arguments": mem_ratios_total,
        "lo.memory.program_bytes(G)": program_bytes,
        "hlo_op_counts": counts,
    }


# --- report ------------------------------------------------------------------------------

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


def _ms(x):
    return f"{x * 1e3:,.3f}"


def _bytes(n):
    return f"{n / 1e6:,.3f}"


def _yes(met):
    return "n/a" if met is None else ("yes" if met else "**no**")


def markdown(report) -> str:
    r, info = report["result"], report["machine"]
    mdl = r["model"]
    sb = mdl["stream_batch_size"]
    nb = -(-mdl["num_examples"] // sb) if sb else 0
    gt, gm = r["goals"]["time"], r["goals"]["memory"]
    lines = [
        "# GGN-vector products (`benchmarks/ggn.py`)",
        "",
        f"Command: `{report['command']}`  ",
        f"Model: {'-'.join(map(str, mdl['sizes']))} tanh MLP ({mdl['num_params']:,} float32 parameters), "
        f"batch {mdl['num_examples']} random inputs, integer labels, categorical likelihood; "
        f"`lo.GGNOp(fn, params, X, y, Categorical(), batch_size={mdl['ggn_batch_size']})`.  ",
        f"**Time goal (median per-round GGN/hand ≤ {GOAL_TIME}): "
        f"{'met' if gt['ggn-jit']['met'] else 'NOT met'} for ggn-jit ({gt['ggn-jit']['median']:.3f}), "
        f"{'met' if gt['ggn-lowered']['met'] else 'NOT met'} for ggn-lowered ({gt['ggn-lowered']['median']:.3f}).**  ",
    ]
    if gm["ggn-jit"]["value"] is not None:
        lines.append(
            f"**Memory goal (temp+output of a GGN product / of a gradient ≤ {GOAL_MEM}): "
            f"{'met' if gm['ggn-jit']['met'] else 'NOT met'} for ggn-jit ({gm['ggn-jit']['value']:.3f}), "
            f"{'met' if gm['ggn-lowered']['met'] else 'NOT met'} for ggn-lowered "
            f"({gm['ggn-lowered']['value']:.3f}).**")
    else:
        lines.append("**Memory goal: not measured (no memory analysis on this backend).**")
    lines += [
        "",
        "## Steady state (interleaved rounds, median)",
        "",
        f"{r['rounds']} rounds; each round calls every method once (order rotated), each call ending in "
        "`block_until_ready()`. Ratios are medians (IQR) of the per-round ratios.",
        "",
        "| method | what | median ms | min ms | × hand (IQR) | × fwd+bwd (IQR) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for m in r["methods"]:
        desc = DESCRIPTIONS[m].format(sb=sb, nb=nb)
        lines.append(f"| {m} | {desc} | {_ms(r['median_s'][m])} | {_ms(r['min_s'][m])} | "
                     f"{_ratio(r['ratios'][f'{m}/hand'])} | {_ratio(r['ratios'][f'{m}/fwd+bwd'])} |")
    lines += [
        "",
        "| goal | value | target | met |",
        "|---|---:|---:|:---:|",
        f"| ggn-jit / hand (time) | {gt['ggn-jit']['median']:.3f} | ≤ {GOAL_TIME} | {_yes(gt['ggn-jit']['met'])} |",
        f"| ggn-lowered / hand (time) | {gt['ggn-lowered']['median']:.3f} | ≤ {GOAL_TIME} | "
        f"{_yes(gt['ggn-lowered']['met'])} |",
    ]
    for m in ("ggn-jit", "ggn-lowered"):
        val = gm[m]["value"]
        lines.append(f"| {m} / fwd+bwd (memory, temp+output) | {'n/a' if val is None else f'{val:.3f}'} | "
                     f"≤ {GOAL_MEM} | {_yes(gm[m]['met'])} |")
    lines += [
        f"| hand / fwd+bwd (time; context: the issue measured 1.4-1.5) | "
        f"{r['ratios']['hand/fwd+bwd']['median']:.3f} | | |",
        "",
        "Checks before timing: " + "; ".join(f"{k} = {v:.1e}" for k, v in r["checks"].items()) + ".",
        "",
        "## Compile (first call: wall time, of which trace / lower / XLA compile from jax.monitoring), seconds",
        "",
        "| method | first call (trace / lower / XLA compile) | XLA compiles |",
        "|---|---|---:|",
    ]
    for m in r["methods"]:
        c = r["compile"][m]
        extra = ""
        if m == "ggn-lowered":
            extra = f" + `lo.lower(G)` {_s(c['lo.lower_s'])}"
        if m == "ggn-jit":
            extra = (f" (building `lo.GGNOp`: {_s(c['GGNOp_construct_s'])} the first time, "
                     f"{_s(c['GGNOp_rebuild_s'])} again)")
        lines.append(f"| {m} | {_s(c['first_call_s'])} ({_s(c['trace_s'])} / {_s(c['lower_s'])} / "
                     f"{_s(c['xla_compile_s'])}){extra} | {c['n_xla_compiles']} |")
    lines += [
        "",
        "After those compiled, first calls with a new operator over the same arrays and shapes:",
        "",
        "| case | first call s | XLA compiles |",
        "|---|---:|---:|",
    ]
    for k, c in r["rebuilt_operator_first_call"].items():
        lines.append(f"| {k} | {_s(c['first_call_s'])} | {c['n_xla_compiles']} |")
    lines += [
        "",
        "A freshly built `GGNOp` has a fresh `uid` (static pytree data), so `jax.jit` and `lo.lower` "
        "compile it again; replacing its params with `eqx.tree_at` keeps the structure and reuses the "
        "program.",
        "",
        "## Memory (XLA memory analysis of each compiled program, MB = 10^6 bytes)",
        "",
        "| method | arguments | output | temp | temp + output | × fwd+bwd (temp + output) "
        "| all three | × fwd+bwd (all three) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in r["methods"]:
        mm = r["memory_analysis"][m]
        if "error" in mm:
            lines.append(f"| {m} | {mm['error']} | | | | | | |")
            continue
        ratio = r["memory_ratio_vs_fwd_bwd"].get(m)
        ratio_all = r["memory_ratio_vs_fwd_bwd_with_arguments"].get(m)
        lines.append(f"| {m} | {_bytes(mm['argument_size_in_bytes'])} | {_bytes(mm['output_size_in_bytes'])} | "
                     f"{_bytes(mm['temp_size_in_bytes'])} | {_bytes(mm['temp_plus_output'])} | "
                     f"{'n/a' if ratio is None else f'{ratio:.3f}'} | {_bytes(mm['total'])} | "
                     f"{'n/a' if ratio_all is None else f'{ratio_all:.3f}'} |")
    pb = r["lo.memory.program_bytes(G)"]
    lines += [
        "",
        "On CPU this is the compiled program's buffer assignment (what XLA reserves to run it), not a "
        "measured process peak. The goal compares temp + output (what running the program adds); the "
        "arguments differ by `v` itself (P floats), which a GGN product takes and a gradient does not. "
        "`lo.memory.program_bytes(G)` (arguments + output + temp): "
        + (f"{_bytes(pb)} MB." if isinstance(pb, int) else f"{pb}."),
        "",
        "## Ops in the optimised HLO of each program",
        "",
        "| method | dot | tanh | while |",
        "|---|---:|---:|---:|",
    ]
    for m in r["methods"]:
        c = r["hlo_op_counts"][m]
        lines.append(f"| {m} | {c['dot']} | {c['tanh']} | {c['while']} |")
    lines += [
        "",
        "A forward pass of the 3-layer MLP is 3 dots, a JVP adds 5 (tangent products), a VJP 5 "
        "(weight gradients and backpropagated cotangents, none for the input); `jvp` and `vjp` alone "
        "drop the unused last forward dot (7 each). One GGN product needs 13 if the JVP and the VJP "
        "share one forward pass, 16 if it is computed twice.",
        "",
        "## Machine",
        "",
        "| key | value |",
        "|---|---|",
    ]
    for key, val in info.items():
        lines.append(f"| {key} | {val} |")
    lines.append("")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def config_for(quick: bool, stream_batch: int | None):
    if quick:
        cfg = {"sizes": [64, 32, 32, 10], "batch": 64, "stream_batch": 16}
    else:
        cfg = {"sizes": [784, 128, 128, 10], "batch": 256, "stream_batch": 64}
    if stream_batch is not None:
        cfg["stream_batch"] = stream_batch if 0 < stream_batch < cfg["batch"] else 0
    return cfg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fast smoke run (small model and batch, few repeats)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--repeats", type=int, default=None, help="max interleaved rounds")
    p.add_argument("--budget", type=float, default=None, help="target seconds of timing")
    p.add_argument("--stream-batch", type=int, default=None,
                   help="batch_size of the streaming context method (0: leave it out)")
    args = p.parse_args(argv)

    repeats = args.repeats or (30 if args.quick else 2000)
    budget = args.budget or (1.0 if args.quick else 75.0)
    min_repeats = min(repeats, 10 if args.quick else 100)
    cfg = config_for(args.quick, args.stream_batch)

    events = CompileEvents()
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPUs; "
        f"up to {repeats} rounds or ~{budget:.0f}s of timing (at least {min_repeats})")
    t_start = time.perf_counter()
    result = run(cfg, repeats=repeats, min_repeats=min_repeats, budget_s=budget, events=events, log=log)
    total = time.perf_counter() - t_start

    argv_str = " ".join(["python", "benchmarks/ggn.py"] + (sys.argv[1:] if argv is None else list(argv)))
    report = {
        "benchmark": "ggn",
        "command": argv_str,
        "goals": {"time": {"ratio": "median per-round GGN / hand", "max": GOAL_TIME},
                  "memory": {"ratio": "(temp + output) of GGN product / of gradient", "max": GOAL_MEM}},
        "quick": args.quick,
        "total_s": total,
        "summary": {
            "time_goal_met": {m: g["met"] for m, g in result["goals"]["time"].items()},
            "memory_goal_met": {m: g["met"] for m, g in result["goals"]["memory"].items()},
            "ggn-jit/hand": result["ratios"]["ggn-jit/hand"]["median"],
            "ggn-lowered/hand": result["ratios"]["ggn-lowered/hand"]["median"],
            "hand/fwd+bwd": result["ratios"]["hand/fwd+bwd"]["median"],
            "ggn-jit/fwd+bwd": result["ratios"]["ggn-jit/fwd+bwd"]["median"],
            "memory ggn-jit/fwd+bwd": result["memory_ratio_vs_fwd_bwd"].get("ggn-jit"),
        },
        "machine": machine_info(),
        "result": result,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ggn.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "ggn.md").write_text(markdown(report), encoding="utf-8")
    s = report["summary"]
    log(f"time goal (GGN/hand <= {GOAL_TIME}): ggn-jit {s['ggn-jit/hand']:.3f}, ggn-lowered "
        f"{s['ggn-lowered/hand']:.3f}; memory goal (<= {GOAL_MEM}): "
        f"{'n/a' if s['memory ggn-jit/fwd+bwd'] is None else format(s['memory ggn-jit/fwd+bwd'], '.3f')}; "
        f"total {total:.1f}s; wrote {out / 'ggn.json'} and {out / 'ggn.md'}")
    return report


if __name__ == "__main__":
    main()
