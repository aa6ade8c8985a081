#!/usr/bin/env python
"""Alternating projections onto the kernel of a network's Jacobian (`lo.AlternatingProjectionOp`).

Model: a 784-128-128-10 tanh MLP (118,282 float32 parameters, a plain per-example
``fn(params, x) -> (10,)`` over a params dict), N = 1024 random inputs, S = 16 examples per
batch (64 batches, R = S·O = 160 Jacobian rows per batch). Measured in one process:

  (a) set-up: ``lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=16)`` (each
      batch's rows by per-example reverse passes, the Gram M_b M_bᵀ by forward-mode products,
      ``eigh``) against the naive route (per batch: materialise M_b, R × P, by vmapped VJPs, form
      M_b M_bᵀ, ``eigh``), both
      as called (first call, compile included: ``from_jacobian`` compiles on every call) and
      compiled (``from_jacobian`` inside ``jax.jit``, steady state), interleaved. **Goal <= 0.5.**
  (b) one sweep ``A.sweep(v)`` (jitted, A as argument) against one training epoch over the same
      64 batches (a jitted SGD step: grad of the mean categorical loss + update, ``lax.scan``-ed),
      with the sweep that recomputes the forward pass (``store_linearization=False``) and a sweep
      written by hand for the MLP (stored activations, same W) as the operator-layer reference.
      **Goal: sweep / epoch <= 1.5.**
  (b') on a smaller model (20-32-32-3 tanh, N = 256, S = 8), float64 and float32: sweeps to
      reach a kernel residual ``||M Πx|| / ||M x||`` of 1e-6 (float64) / 1e-4 (float32),
      ``method="cg"`` (the smallest ``rtol`` of a decade ladder that reaches it) against
      ``method="plain"`` (``rtol=0``, a fixed ``max_sweeps``: the first count that reaches it).
  (c) memory: the stored factors ``A.W.nbytes`` against the Jacobian itself (N·O·P·itemsize).
  (d) ``A @ eps`` with ``eps`` of shape (P, k), k in {1, 8, 32}: time per sample (small model,
      float32; the CG projection of the large model is too slow for 2 CPU cores: see README).

Agreement checks before timing: the factors of ``from_jacobian`` are pseudo-inverses of the
naive Grams (and have the same ranks), the jitted build gives the same factors as the eager
one, the operator's sweep equals the hand-written sweep, and ``A @ eps`` column by column
equals ``A @ eps[:, i]``.

Run:  python benchmarks/projected.py            # full run (about 3-4 minutes on 2 cores)
      python benchmarks/projected.py --quick    # smoke run (seconds; small models)
      python benchmarks/projected.py --out DIR  # write DIR/projected.json and DIR/projected.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import linops as lo
from linops.models import ravel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ggn import batched, init_params, interleaved, make_mlp, ratio_stats  # noqa: E402
from overhead import CompileEvents, _ratio, _s, fresh_jit, machine_info, rel_err  # noqa: E402

GOAL_SETUP = 0.5   # from_jacobian set-up time / naive set-up time
GOAL_SWEEP = 1.5   # one sweep / one training epoch
TARGETS = {"float64": 1e-6, "float32": 1e-4}
TOL = 1e-4


# --- problem -----------------------------------------------------------------------------


def make_problem(sizes, n, dtype, seed=0):
    kp, kx, ky = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = jax.tree_util.tree_map(lambda a: a.astype(dtype), init_params(kp, sizes))
    X = jax.random.normal(kx, (n, sizes[0]), jnp.float32).astype(dtype)
    y = jax.random.randint(ky, (n,), 0, sizes[-1])
    return make_mlp(len(sizes) - 1), params, X, y


def batches_of(a, s):
    """(N, ...) -> (N // s, s, ...); N is a multiple of s here (no padded last batch)."""
    return a.reshape((a.shape[0] // s, s) + a.shape[1:])


def naive_factors_fn(fn, unravel, rows, size):
    """Per batch: M_b (R × P) by R vmapped VJPs, G = M_b M_bᵀ; then eigh with linops' cut-off.

    Two loops, as the library does: an eigendecomposition in the same loop body as the products
    slows those products about 1.7× on CPU, which would flatter the ratio.
    """

    def factors(params, Xb):
        eye = jnp.eye(rows, dtype=Xb.dtype)

        def gram(xb):
            out, vjp = jax.vjp(lambda p: batched(fn)(p, xb), params)
            Mb = jax.vmap(lambda e: ravel(vjp(e.reshape(out.shape))[0])[0])(eye)   # (R, P), materialised
            gram = Mb @ Mb.T
            return 0.5 * (gram + gram.T)

        def factor(gram):
            w, Q = jnp.linalg.eigh(gram)
            keep = w > max(rows, size) * jnp.finfo(w.dtype).eps * jnp.max(w)
            scale = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, w, 1.0)), 0.0)
            return (Q * scale[None, :]).T

        grams = lax.map(gram, Xb)
        return lax.map(factor, grams), grams

    return factors


def pinv_error(W, G):
    """max over batches of ||G WᵀW G − G|| / ||G|| (0 when WᵀW is a pseudo-inverse of G)."""
    WtW = jnp.einsum("bij,bik->bjk", W, W)
    E = jnp.einsum("bij,bjk,bkl->bil", G, WtW, G) - G
    return float(jnp.max(jnp.linalg.norm(E, axis=(1, 2)) / jnp.linalg.norm(G, axis=(1, 2))))


def ranks(W):
    return np.asarray(jnp.sum(jnp.any(W != 0, axis=2), axis=1))


# --- (a), (b), (c): the large model ------------------------------------------------------


def run_setup_and_sweep(cfg, *, events, log, rounds_setup, sweep_repeats, sweep_min, sweep_budget):
    sizes, n, s = cfg["sizes"], cfg["n"], cfg["batch_size"]
    fn, params, X, y = make_problem(sizes, n, jnp.float32)
    flat, unravel = ravel(params)
    P, B, R = int(flat.shape[0]), n // s, s * sizes[-1]
    n_out = sizes[-1]
    log(f"(a)-(c) model {'-'.join(map(str, sizes))} tanh MLP, P={P:,}, N={n}, S={s}: {B} batches of R={R} rows")
    Xb, yb = batches_of(X, s), batches_of(y, s)

    build = lambda: lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=s)  # noqa: E731
    build_jit = fresh_jit(lambda params, X: lo.AlternatingProjectionOp.from_jacobian(
        fn, params, X, batch_size=s).W)
    naive_f = naive_factors_fn(fn, unravel, R, P)

    # (a) as called: from_jacobian (compiles its lax.map on every call) vs the naive jit's first call.
    first = {"from_jacobian": [], "naive": []}
    first_detail = {"from_jacobian": [], "naive": []}
    A = naive = None
    for r in range(rounds_setup):
        order = ["from_jacobian", "naive"] if r % 2 == 0 else ["naive", "from_jacobian"]
        for name in order:
            if name == "from_jacobian":
                holder = {}

                def call(holder=holder):
                    holder["A"] = build()
                    return holder["A"].W

                _, rep = events.measure(call)
                A = holder["A"]
            else:
                naive_jit = fresh_jit(naive_f)
                naive, rep = events.measure(lambda: naive_jit(params, Xb))  # noqa: B023
            first[name].append(rep["first_call_s"])
            first_detail[name].append(rep)
    log("  as called (s): " + "  ".join(f"{k}={[round(t, 2) for t in v]}" for k, v in first.items()))

    # Agreement: the library's factors are pseudo-inverses of the naive Grams, same ranks.
    W_naive, G_naive = naive
    W_jit, rep_jit = events.measure(lambda: build_jit(params, X))
    checks = {
        "from_jacobian W: max_b ||G WᵀW G − G||/||G|| (G naive Gram)": pinv_error(A.W, G_naive),
        "naive W: max_b ||G WᵀW G − G||/||G||": pinv_error(W_naive, G_naive),
        "jitted from_jacobian WᵀW vs eager WᵀW (rel err)": rel_err(
            jnp.einsum("bij,bik->bjk", W_jit, W_jit), jnp.einsum("bij,bik->bjk", A.W, A.W)),
    }
    rank_lib, rank_naive = ranks(A.W), ranks(W_naive)
    checks["ranks equal (from_jacobian vs naive)"] = bool(np.array_equal(rank_lib, rank_naive))
    log("  checks: " + "  ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in checks.items()))
    if checks["from_jacobian W: max_b ||G WᵀW G − G||/||G|| (G naive Gram)"] > 1e-2:
        raise SystemExit("from_jacobian's factors disagree with the naive Grams")

    # (a) compiled, steady state: from_jacobian inside jax.jit vs the naive jit.
    calls = {"from_jacobian (jit)": lambda: build_jit(params, X), "naive (jit)": lambda: naive_jit(params, Xb)}
    # Both programs are compiled already (the checks above): no warm-up rounds, they take seconds.
    times, n_rounds = {k: [] for k in calls}, rounds_setup
    for r in range(n_rounds):
        for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            t0 = time.perf_counter()
            jax.block_until_ready(calls[name]())
            times[name].append(time.perf_counter() - t0)
    setup = {
        "as_called_s": first,
        "as_called_detail": first_detail,
        "as_called_ratio_of_medians": statistics.median(first["from_jacobian"]) / statistics.median(first["naive"]),
        "as_called_per_round_ratios": [a / b for a, b in zip(first["from_jacobian"], first["naive"], strict=True)],
        "jit_first_call": rep_jit,
        "steady_rounds": n_rounds,
        "steady_median_s": {k: statistics.median(v) for k, v in times.items()},
        "steady_times_s": times,
        "steady_ratio": ratio_stats(times, "from_jacobian (jit)", "naive (jit)"),
        "ranks_from_jacobian": sorted(set(rank_lib.tolist())),
        "ranks_naive": sorted(set(rank_naive.tolist())),
    }
    setup["goal_as_called_met"] = bool(setup["as_called_ratio_of_medians"] <= GOAL_SETUP)
    setup["goal_steady_met"] = bool(setup["steady_ratio"]["median"] <= GOAL_SETUP)
    log(f"  as called: from_jacobian/naive = {setup['as_called_ratio_of_medians']:.3f}; steady "
        f"{setup['steady_median_s']}: ratio {setup['steady_ratio']['median']:.3f}")

    # (c) memory.
    item = np.dtype(np.float32).itemsize
    memory = {"W_nbytes": int(A.W.nbytes), "W_shape": list(A.W.shape),
              "jacobian_nbytes": n * n_out * P * item, "per_batch_jacobian_nbytes": R * P * item}
    memory["ratio"] = memory["W_nbytes"] / memory["jacobian_nbytes"]

    # (b) one sweep vs one training epoch (and a hand-written sweep with the same W).
    lr = 0.1

    def loss(p, x, t):
        out = batched(fn)(p, x)
        return jnp.mean(jax.nn.logsumexp(out, axis=-1) - jnp.take_along_axis(out, t[:, None], axis=1)[:, 0])

    def epoch_f(params, Xb, yb):
        def step(p, b):
            g = jax.grad(loss)(p, *b)
            return jax.tree_util.tree_map(lambda a, d: a - lr * d, p, g), None

        return lax.scan(step, params, (Xb, yb))[0]

    layers = len(sizes) - 1

    def activations_f(params, Xb):
        """Per batch: each layer's input h_l and the hidden layers' tanh' (what a sweep needs)."""
        def one(xb):
            hs, ds, h = [xb], [], xb
            for i in range(layers - 1):
                h = jnp.tanh(h @ params[f"W{i}"] + params[f"b{i}"])
                hs.append(h)
                ds.append(1 - h**2)
            return hs, ds

        return lax.map(one, Xb)

    def hand_sweep_f(params, acts, W, v):
        """The sweep written by hand for this MLP: stored activations, params-shaped carry."""
        def q(t, b):
            (hs, ds), Wb = b
            z = hs[0] @ t["W0"] + t["b0"]
            for i in range(1, layers):
                z = hs[i] @ t[f"W{i}"] + t[f"b{i}"] + (ds[i - 1] * z) @ params[f"W{i}"]
            c = (Wb.T @ (Wb @ z.reshape(-1))).reshape(z.shape)
            g = {}
            for i in reversed(range(layers)):
                g[f"W{i}"], g[f"b{i}"] = hs[i].T @ c, c.sum(0)
                if i:
                    c = (c @ params[f"W{i}"].T) * ds[i - 1]
            return jax.tree_util.tree_map(jnp.subtract, t, g), None

        return ravel(lax.scan(q, unravel(v), ((acts[0], acts[1]), W))[0])[0]

    A_fresh = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=s, store_linearization=False)
    acts = jax.jit(activations_f)(params, Xb)
    sweep = fresh_jit(lambda A, v: A.sweep(v))
    hand_sweep, epoch = fresh_jit(hand_sweep_f), fresh_jit(epoch_f)
    v = jax.random.normal(jax.random.PRNGKey(1), (P,), jnp.float32)
    calls = {"sweep": lambda: sweep(A, v), "sweep (recompute)": lambda: sweep(A_fresh, v),
             "hand sweep": lambda: hand_sweep(params, acts, A.W, v), "epoch": lambda: epoch(params, Xb, yb)}
    compile_b, outs = {}, {}
    for k, c in calls.items():
        outs[k], compile_b[k] = events.measure(c)
    last = lambda w: jax.jvp(lambda p: batched(fn)(p, Xb[-1]), (params,), (unravel(w),))[1]  # noqa: E731
    checks["sweep vs hand sweep (rel err)"] = rel_err(outs["sweep"], outs["hand sweep"])
    checks["sweep vs sweep (recompute) (rel err)"] = rel_err(outs["sweep"], outs["sweep (recompute)"])
    checks["stored linearisation vs factors W (bytes)"] = (f"{sum(a.nbytes for a in A.stored):,} vs "
                                                           f"{A.W.nbytes:,}")
    checks["||M_B sweep(v)|| / ||M_B v|| (last batch)"] = float(
        jnp.linalg.norm(last(outs["sweep"])) / jnp.linalg.norm(last(v)))
    l0, l1 = float(loss(params, X, y)), float(loss(outs["epoch"], X, y))
    checks["epoch: loss before → after (all N)"] = f"{l0:.4f} → {l1:.4f}"
    if max(checks["sweep vs hand sweep (rel err)"], checks["sweep vs sweep (recompute) (rel err)"]) > TOL:
        raise SystemExit("A.sweep disagrees with the hand-written sweep")
    times, n_rounds = interleaved(calls, repeats=sweep_repeats, min_repeats=sweep_min, budget_s=sweep_budget)
    sweep_rep = {
        "rounds": n_rounds,
        "median_s": {k: statistics.median(t) for k, t in times.items()},
        "min_s": {k: min(t) for k, t in times.items()},
        "ratios": {"sweep/epoch": ratio_stats(times, "sweep", "epoch"),
                   "sweep (recompute)/epoch": ratio_stats(times, "sweep (recompute)", "epoch"),
                   "hand sweep/epoch": ratio_stats(times, "hand sweep", "epoch"),
                   "sweep/hand sweep": ratio_stats(times, "sweep", "hand sweep")},
        "compile": compile_b,
        "learning_rate": lr,
    }
    sweep_rep["goal_met"] = bool(sweep_rep["ratios"]["sweep/epoch"]["median"] <= GOAL_SWEEP)
    log(f"  sweep: rounds={n_rounds} " + "  ".join(f"{k}={t * 1e3:.1f}ms" for k, t in sweep_rep["median_s"].items())
        + f"  sweep/epoch={sweep_rep['ratios']['sweep/epoch']['median']:.3f}")
    return {
        "model": {"sizes": sizes, "num_params": P, "num_examples": n, "batch_size": s, "num_batches": B,
                  "rows_per_batch": R, "num_outputs": n_out, "dtype": "float32"},
        "setup": setup, "memory": memory, "sweep": sweep_rep, "checks": checks,
    }


# --- (b'): sweeps to a kernel residual, cg vs plain --------------------------------------


def run_convergence(cfg, dtype_name, *, events, log):
    sizes, n, s = cfg["sizes"], cfg["n"], cfg["batch_size"]
    dtype = jnp.float64 if dtype_name == "float64" else jnp.float32
    target = TARGETS[dtype_name]
    fn, params, X, _ = make_problem(sizes, n, dtype)
    flat, unravel = ravel(params)
    P, B = int(flat.shape[0]), n // s
    x = jax.random.normal(jax.random.PRNGKey(2), (P,), dtype)
    build = lambda **o: lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=s, **o)  # noqa: E731
    project = fresh_jit(lambda A, x: A.project(x))

    def timed_project(A):
        proj, rep = events.measure(lambda: project(A, x))
        t0 = time.perf_counter()
        jax.block_until_ready(project(A, x))
        return proj, rep["first_call_s"], time.perf_counter() - t0

    def row(proj, first_s, run_s, **extra):
        return dict(sweeps=int(proj.sweeps), converged=bool(proj.converged),
                    kernel_residual=float(proj.kernel_residual), first_call_s=first_s, run_s=run_s, **extra)

    # CG: the default rtol, then a decade ladder until the kernel residual reaches the target.
    cg_runs = []
    A = build(method="cg", max_sweeps=cfg["cg_cap"])
    cg_default = row(*timed_project(A), rtol=A.rtol)
    for rtol in [] if cg_default["kernel_residual"] <= target else cfg["rtols"][dtype_name]:
        r = row(*timed_project(build(method="cg", rtol=rtol, max_sweeps=cfg["cg_cap"])), rtol=rtol)
        cg_runs.append(r)
        if r["kernel_residual"] <= target:
            break
    cg_hit = min((r for r in [cg_default] + cg_runs if r["kernel_residual"] <= target),
                 key=lambda r: r["sweeps"], default=None)

    # Plain: the kernel residual after each of up to plain_cap sweeps (one jitted scan), then
    # the library's own fixed-count run (rtol=0, max_sweeps = first count reaching the target).
    Ap = build(method="plain", rtol=0.0, max_sweeps=cfg["plain_cap"])

    def trajectory_f(A, params, X, x):
        def knorm(w):
            return jnp.linalg.norm(jax.jvp(lambda p: batched(fn)(p, X), (params,), (unravel(w),))[1])

        k0 = knorm(x)

        def step(w, _):
            w = A.sweep(w)
            return w, knorm(w) / k0

        return lax.scan(step, x, None, length=A.max_sweeps)[1]

    traj, rep_traj = events.measure(lambda: fresh_jit(trajectory_f)(Ap, params, X, x))
    traj = np.asarray(traj)
    hit = np.nonzero(traj <= target)[0]
    t_hit = int(hit[0]) + 1 if hit.size else None
    plain_fixed = None
    if cfg.get("plain_fixed_run", True):  # left out of --quick (one more compile)
        plain_fixed = row(*timed_project(build(method="plain", rtol=0.0, max_sweeps=t_hit or cfg["plain_cap"])),
                          max_sweeps=t_hit or cfg["plain_cap"])
    checkpoints = sorted({c for c in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if c <= len(traj)}
                         | {len(traj)})
    res = {
        "dtype": dtype_name, "target": target, "num_params": P, "num_batches": B, "rows_per_batch": s * sizes[-1],
        "cg_default_rtol": cg_default, "cg_ladder": cg_runs, "cg_first_reaching_target": cg_hit,
        "plain_first_sweep_reaching_target": t_hit, "plain_cap": cfg["plain_cap"],
        "plain_residual_at": {str(c): float(traj[c - 1]) for c in checkpoints},
        "plain_min_residual": float(traj.min()),
        "plain_fixed_run": plain_fixed, "plain_trajectory_first_call_s": rep_traj["first_call_s"],
        "q_applications_per_cg_sweep": 2 * B - 1, "q_applications_per_plain_sweep": B,
    }
    hit_txt = "none" if cg_hit is None else f"rtol {cg_hit['rtol']:.1e}, {cg_hit['sweeps']} sweeps"
    log(f"(b') {dtype_name}: target {target:g}; cg default rtol {cg_default['rtol']:.1e}: sweeps "
        f"{cg_default['sweeps']} residual {cg_default['kernel_residual']:.2e}; cg reaching target: "
        f"{hit_txt}; plain: "
        f"{t_hit} sweeps (min residual {traj.min():.2e} in {len(traj)})")
    return res


# --- (d): samples sharing a projection ---------------------------------------------------


def run_samples(cfg, *, events, log, repeats, budget_s, one_projection):
    sizes, n, s = cfg["sizes"], cfg["n"], cfg["batch_size"]
    fn, params, X, _ = make_problem(sizes, n, jnp.float32)
    P = int(ravel(params)[0].shape[0])
    t0 = time.perf_counter()
    A = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=s)
    jax.block_until_ready(A.W)
    setup_s = time.perf_counter() - t0
    apply = fresh_jit(lambda A, e: A @ e)
    eps_max = jax.random.normal(jax.random.PRNGKey(3), (P, max(cfg["ks"])), jnp.float32)
    calls, compile_d, outs = {}, {}, {}
    for k in cfg["ks"]:
        e = eps_max[:, :k]
        calls[f"k={k}"] = lambda e=e: apply(A, e)
        outs[k], compile_d[f"k={k}"] = events.measure(calls[f"k={k}"])
    # Agreement: the batched product column by column equals the single-vector product.
    kmax = max(cfg["ks"])
    cols = [0, kmax - 1]
    single = [apply(A, eps_max[:, i:i + 1])[:, 0] for i in cols]
    checks = {f"(A @ eps)[:, {i}] vs A @ eps[:, {i}:{i + 1}] (rel err)": rel_err(outs[kmax][:, i], sv)
              for i, sv in zip(cols, single, strict=True)}
    times, n_rounds = interleaved(calls, repeats=repeats, min_repeats=min(repeats, 5), budget_s=budget_s)
    med = {k: statistics.median(t) for k, t in times.items()}
    per = {k: med[f"k={k}"] / k for k in cfg["ks"]}
    rep = {
        "model": {"sizes": sizes, "num_params": P, "num_examples": n, "batch_size": s, "dtype": "float32"},
        "setup_s": setup_s, "rounds": n_rounds, "median_s": med,
        "per_sample_s": {str(k): v for k, v in per.items()},
        "per_sample_with_setup_s": {str(k): (setup_s + med[f"k={k}"]) / k for k in cfg["ks"]},
        "speedup_vs_k1": {str(k): per[1] / per[k] for k in cfg["ks"]} if 1 in per else {},
        "compile": compile_d, "checks": checks,
        "one_projection": one_projection,
    }
    log(f"(d) {'-'.join(map(str, sizes))}: " + "  ".join(f"k={k}: {per[k] * 1e3:.2f} ms/sample" for k in cfg["ks"]))
    return rep


# --- report ------------------------------------------------------------------------------


def _ms(x):
    return f"{x * 1e3:,.1f}"


def _yes(met):
    return "yes" if met else "**no**"


def _mb(b):
    return f"{b / 1e6:,.2f}"


def markdown(report) -> str:
    r, info, cfg = report["result"], report["machine"], report["config"]
    big, conv, samp = r["large"], r["convergence"], r["samples"]
    m, st, mem, sw = big["model"], big["setup"], big["memory"], big["sweep"]
    checks_b = big["checks"]
    sizes = "-".join(map(str, m["sizes"]))
    csizes = "-".join(map(str, cfg["convergence"]["sizes"]))
    lines = [
        "# Alternating projections (`benchmarks/projected.py`)",
        "",
        f"Command: `{report['command']}`  ",
        f"Model (a)-(c): {sizes} tanh MLP ({m['num_params']:,} float32 parameters), N = {m['num_examples']} random "
        f"inputs, S = {m['batch_size']} per batch: {m['num_batches']} batches of R = {m['rows_per_batch']} "
        f"Jacobian rows. (b') and (d): a {csizes} tanh MLP, N = {cfg['convergence']['n']}, "
        f"S = {cfg['convergence']['batch_size']} (see below).",
        "",
        "| goal | value | target | met |",
        "|---|---:|---:|:---:|",
        f"| (a) set-up, as called: `from_jacobian` / naive (first calls, compile included; ratio of medians) | "
        f"{st['as_called_ratio_of_medians']:.3f} | ≤ {GOAL_SETUP} | {_yes(st['goal_as_called_met'])} |",
        f"| (a) set-up, compiled: `jit(from_jacobian)` / `jit(naive)` (median per-round ratio) | "
        f"{st['steady_ratio']['median']:.3f} | ≤ {GOAL_SETUP} | {_yes(st['goal_steady_met'])} |",
        f"| (b) one sweep / one training epoch (median per-round ratio) | "
        f"{sw['ratios']['sweep/epoch']['median']:.3f} | ≤ {GOAL_SWEEP} | {_yes(sw['goal_met'])} |",
        "",
        "## (a) Factor set-up",
        "",
        "`lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=S)` (per batch: the R rows of M_b "
        "by per-example reverse passes, `jax.jacrev` of one example each, then the Gram M_b M_bᵀ by R forward-mode "
        "products of the batch's stored linearisation with them; `eigh` in a second loop; timed to "
        "`jax.block_until_ready(A.W)`) against the naive route, a `jax.jit` function that per batch materialises "
        "M_b (R × P) by R vmapped VJPs of the whole batch, forms M_b M_bᵀ, and takes `eigh` with the same cut-off "
        "in a second loop (`lax.map` over batches, as the operator does; an `eigh` in the same loop body slows "
        "the products about 1.7× on CPU, for either route). `from_jacobian` builds new closures on every call, "
        "so every call traces and compiles its loops again: *as called* compares it with the naive jit's first "
        "call (compile included); *compiled* wraps `from_jacobian` in `jax.jit` and compares steady-state calls, "
        "interleaved.",
        "",
        "| route | as called: first call s (each round) | of which XLA compile s | compiled: median s |",
        "|---|---|---|---:|",
    ]
    names = {"from_jacobian": "from_jacobian (jit)", "naive": "naive (jit)"}
    for k in ("from_jacobian", "naive"):
        comp = [d["xla_compile_s"] for d in st["as_called_detail"][k]]
        lines.append(f"| {k} | {', '.join(f'{t:.2f}' for t in st['as_called_s'][k])} | "
                     f"{', '.join(_s(t) for t in comp)} | {st['steady_median_s'][names[k]]:.3f} |")
    lines += [
        "",
        f"As called: ratio of medians {st['as_called_ratio_of_medians']:.3f} (per round: "
        f"{', '.join(f'{x:.3f}' for x in st['as_called_per_round_ratios'])}). Compiled: {st['steady_rounds']} "
        f"rounds, median per-round ratio {_ratio(st['steady_ratio'])}. Ranks kept per batch: from_jacobian "
        f"{st['ranks_from_jacobian']}, naive {st['ranks_naive']}.",
        "",
        "## (b) One sweep vs one training epoch",
        "",
        f"`jax.jit(lambda A, v: A.sweep(v))(A, v)` (Q_B ⋯ Q_1 v over the {m['num_batches']} batches) against one "
        f"epoch of SGD over the same batches (a jitted `lax.scan` of `grad` of the mean categorical loss + update, "
        f"lr {sw['learning_rate']}). **sweep** runs on the linearisations stored at set-up (the default; "
        f"{checks_b['stored linearisation vs factors W (bytes)']} bytes stored vs the factors), **sweep "
        f"(recompute)** is `store_linearization=False` (a forward pass per batch in every sweep), **hand sweep** "
        f"is the stored-activation sweep written by hand for this MLP (params-shaped carry, the same W), the "
        f"reference for the operator layer. {sw['rounds']} interleaved rounds.",
        "",
        "| method | median ms | min ms | first call s |",
        "|---|---:|---:|---:|",
    ]
    for k in sw["median_s"]:
        lines.append(f"| {k} | {_ms(sw['median_s'][k])} | {_ms(sw['min_s'][k])} | "
                     f"{sw['compile'][k]['first_call_s']:.2f} |")
    lines += [
        "",
        "| ratio (median per-round, IQR) | value |",
        "|---|---:|",
    ]
    for k, v in sw["ratios"].items():
        lines.append(f"| {k} | {_ratio(v)} |")
    lines += [
        "",
        "## (b') Sweeps to a kernel residual: `method=\"cg\"` vs `method=\"plain\"`",
        "",
        f"Smaller model: {csizes} tanh MLP, N = {cfg['convergence']['n']}, S = {cfg['convergence']['batch_size']} "
        f"({conv[0]['num_batches']} batches of {conv[0]['rows_per_batch']} rows, P = {conv[0]['num_params']:,}; "
        f"{conv[0]['num_batches'] * conv[0]['rows_per_batch']} rows in all, so the kernel has dimension ≥ "
        f"{conv[0]['num_params'] - conv[0]['num_batches'] * conv[0]['rows_per_batch']}), one random x. Kernel "
        "residual = `Projection.kernel_residual` = ‖M Πx‖ / ‖M x‖. float64 under `jax.enable_x64(True)`. "
        "CG: the default `rtol`, then a decade ladder of `rtol` (float64: 1e-8, 1e-9, 1e-10; float32: 1e-4, 1e-5, "
        "1e-6) until the residual reaches the target. A CG "
        "*sweep* (as `Projection.sweeps` counts it) is a symmetric sweep, 2B − 1 batch projections Q_b; a "
        "plain sweep is B. Plain: `rtol=0`, the residual after every sweep up to the cap (one jitted scan of "
        "`A.sweep`), then the library's own run with `max_sweeps` fixed at the first count reaching the "
        "target. Times: a second call of the jitted `A.project` (single call, not interleaved).",
        "",
        "| dtype | target | method | rtol / max_sweeps | sweeps | Q_b applications | converged | kernel residual "
        "| time s |",
        "|---|---:|---|---|---:|---:|:---:|---:|---:|",
    ]
    for c in conv:
        qc, qp = c["q_applications_per_cg_sweep"], c["q_applications_per_plain_sweep"]
        d = c["cg_default_rtol"]
        lines.append(f"| {c['dtype']} | {c['target']:g} | cg (default rtol) | {d['rtol']:.1e} | {d['sweeps']} | "
                     f"{d['sweeps'] * qc} | {d['converged']} | {d['kernel_residual']:.2e} | {d['run_s']:.3f} |")
        for g in c["cg_ladder"]:
            lines.append(f"| {c['dtype']} | {c['target']:g} | cg | {g['rtol']:.0e} | {g['sweeps']} | "
                         f"{g['sweeps'] * qc} | {g['converged']} | {g['kernel_residual']:.2e} | {g['run_s']:.3f} |")
        pf = c["plain_fixed_run"]
        if pf is None:
            continue
        lines.append(f"| {c['dtype']} | {c['target']:g} | plain (rtol=0) | max_sweeps={pf['max_sweeps']} | "
                     f"{pf['sweeps']} | {pf['sweeps'] * qp} | {pf['converged']} | {pf['kernel_residual']:.2e} | "
                     f"{pf['run_s']:.3f} |")
    lines += [
        "",
        "| dtype | target | cg: sweeps (Q_b) to target | plain: sweeps (Q_b) to target | plain residual after "
        "n sweeps |",
        "|---|---:|---|---|---|",
    ]
    for c in conv:
        qc, qp = c["q_applications_per_cg_sweep"], c["q_applications_per_plain_sweep"]
        h = c["cg_first_reaching_target"]
        cg_txt = "not reached" if h is None else f"{h['sweeps']} ({h['sweeps'] * qc}) at rtol {h['rtol']:.1e}"
        t = c["plain_first_sweep_reaching_target"]
        pl_txt = (f"not reached in {c['plain_cap']} (min {c['plain_min_residual']:.1e})" if t is None
                  else f"{t} ({t * qp})")
        at = ", ".join(f"{k}: {v:.1e}" for k, v in c["plain_residual_at"].items())
        lines.append(f"| {c['dtype']} | {c['target']:g} | {cg_txt} | {pl_txt} | {at} |")
    lines += [
        "",
        "## (c) Memory of the stored factors",
        "",
        "| what | shape | MB |",
        "|---|---|---:|",
        f"| `A.W` (R × R factor per batch) | {' × '.join(map(str, mem['W_shape']))} float32 | "
        f"{_mb(mem['W_nbytes'])} |",
        f"| the Jacobian, N·O × P | {m['num_examples'] * m['num_outputs']:,} × {m['num_params']:,} float32 | "
        f"{_mb(mem['jacobian_nbytes'])} |",
        f"| one batch's Jacobian M_b (what the naive route holds at a time) | {m['rows_per_batch']} × "
        f"{m['num_params']:,} float32 | {_mb(mem['per_batch_jacobian_nbytes'])} |",
        "",
        f"`A.W.nbytes` / Jacobian bytes = {mem['ratio']:.2e} ({1 / mem['ratio']:,.0f}× smaller). The operator "
        "also keeps the params and the (padded) inputs, which any route needs.",
        "",
        "## (d) Samples sharing one projection: `A @ eps`, eps (P, k)",
        "",
        f"Small model ({'-'.join(map(str, samp['model']['sizes']))}, P = {samp['model']['num_params']:,}, N = "
        f"{samp['model']['num_examples']}, S = {samp['model']['batch_size']}, float32, default `method=\"cg\"`, "
        f"rtol {samp['one_projection']['rtol']:.1e}: one projection takes {samp['one_projection']['sweeps']} "
        f"sweeps, kernel residual {samp['one_projection']['kernel_residual']:.1e}). On the large model one "
        "CG projection is tens to hundreds of symmetric sweeps, each about twice (b)'s sweep, and k up to 32 "
        f"of them do not fit this run's time budget on 2 CPU cores. "
        f"`jax.jit(lambda A, e: A @ e)`, {samp['rounds']} interleaved rounds; the "
        f"factor set-up ({samp['setup_s']:.2f} s, compile included) is shared by all k samples.",
        "",
        "| k | median ms per call | ms per sample | speed-up per sample vs k = 1 | (set-up + call) / k, ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for k in cfg["samples"]["ks"]:
        lines.append(f"| {k} | {_ms(samp['median_s'][f'k={k}'])} | {samp['per_sample_s'][str(k)] * 1e3:,.2f} | "
                     f"{samp['speedup_vs_k1'].get(str(k), float('nan')):.2f} | "
                     f"{samp['per_sample_with_setup_s'][str(k)] * 1e3:,.1f} |")
    checks = dict(big["checks"])
    checks.update(samp["checks"])
    lines += [
        "",
        "## Checks (before timing)",
        "",
        "| check | value |",
        "|---|---|",
    ]
    for k, v in checks.items():
        lines.append(f"| {k} | {v:.2e} |" if isinstance(v, float) else f"| {k} | {v} |")
    lines += ["", "## Machine", "", "| key | value |", "|---|---|"]
    for key, val in info.items():
        lines.append(f"| {key} | {val} |")
    lines.append("")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def config_for(quick: bool):
    small = {"sizes": [20, 32, 32, 3], "n": 256, "batch_size": 8}
    if quick:  # smoke run: tiny models, no rtol ladder (every compile costs seconds, whatever the size)
        tiny = {"sizes": [20, 16, 16, 3], "n": 64, "batch_size": 8}
        return {
            "large": {"sizes": [64, 32, 32, 10], "n": 128, "batch_size": 16},
            "convergence": dict(tiny, cg_cap=200, plain_cap=200, rtols={"float64": [], "float32": []},
                                plain_fixed_run=False),
            "samples": dict(tiny, ks=[1, 8]),
        }
    return {
        "large": {"sizes": [784, 128, 128, 10], "n": 1024, "batch_size": 16},
        "convergence": dict(small, cg_cap=500, plain_cap=5000,
                            rtols={"float64": [1e-8, 1e-9, 1e-10], "float32": [1e-4, 1e-5, 1e-6]}),
        "samples": dict(small, ks=[1, 8, 32]),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fast smoke run (small models, few repeats)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="output directory (default: benchmarks/results)")
    args = p.parse_args(argv)
    cfg = config_for(args.quick)

    events = CompileEvents()
    t_start = time.perf_counter()
    log = lambda s: print(f"[{time.perf_counter() - t_start:6.1f}s] {s}", flush=True)  # noqa: E731
    log(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPUs")
    large = run_setup_and_sweep(cfg["large"], events=events, log=log,
                                rounds_setup=1 if args.quick else 2,
                                sweep_repeats=20 if args.quick else 200, sweep_min=5 if args.quick else 30,
                                sweep_budget=1.0 if args.quick else 15.0)
    convergence = []
    with jax.enable_x64(True):
        convergence.append(run_convergence(cfg["convergence"], "float64", events=events, log=log))
    convergence.append(run_convergence(cfg["convergence"], "float32", events=events, log=log))
    # (d) uses (b')'s model: its float32 default-rtol projection is the one each column runs.
    samples = run_samples(cfg["samples"], events=events, log=log, repeats=10 if args.quick else 40,
                          budget_s=1.0 if args.quick else 15.0, one_projection=convergence[1]["cg_default_rtol"])
    total = time.perf_counter() - t_start

    st, sw = large["setup"], large["sweep"]
    report = {
        "benchmark": "projected",
        "command": " ".join(["python", "benchmarks/projected.py"] + (sys.argv[1:] if argv is None else list(argv))),
        "goals": {"setup": {"ratio": "from_jacobian / naive set-up time", "max": GOAL_SETUP},
                  "sweep": {"ratio": "one sweep / one training epoch", "max": GOAL_SWEEP},
                  "kernel_residual_targets": TARGETS},
        "quick": args.quick,
        "total_s": total,
        "config": cfg,
        "summary": {
            "setup as called (ratio of medians)": st["as_called_ratio_of_medians"],
            "setup compiled (median per-round ratio)": st["steady_ratio"]["median"],
            "setup_goal_met_as_called": st["goal_as_called_met"],
            "setup_goal_met_compiled": st["goal_steady_met"],
            "sweep/epoch": sw["ratios"]["sweep/epoch"]["median"],
            "sweep_goal_met": sw["goal_met"],
            "W bytes / Jacobian bytes": large["memory"]["ratio"],
            "sweeps to target": {c["dtype"]: {
                "cg": None if c["cg_first_reaching_target"] is None else c["cg_first_reaching_target"]["sweeps"],
                "plain": c["plain_first_sweep_reaching_target"]} for c in convergence},
            "per-sample ms": {k: v * 1e3 for k, v in samples["per_sample_s"].items()},
        },
        "machine": machine_info(),
        "result": {"large": large, "convergence": convergence, "samples": samples},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "projected.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    (out / "projected.md").write_text(markdown(report), encoding="utf-8")
    s = report["summary"]
    log(f"set-up goal (<= {GOAL_SETUP}): as called {s['setup as called (ratio of medians)']:.3f}, compiled "
        f"{s['setup compiled (median per-round ratio)']:.3f}; sweep goal (<= {GOAL_SWEEP}): {s['sweep/epoch']:.3f}; "
        f"total {total:.1f}s; wrote {out / 'projected.json'} and {out / 'projected.md'}")
    return report


if __name__ == "__main__":
    main()
