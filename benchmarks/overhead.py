#!/usr/bin/env python
"""Cost of the operator layer: a composed ``Xᵀ Kᵀ D K X + λI`` applied three ways.

For each expression and size, in one process and on the same arrays:

  (a) ``jit-pytree``: ``jax.jit(lambda op, v: op @ v)(expr, v)``: the operator is a pytree
      argument of an ordinary ``jax.jit`` (no simplification);
  (b) ``lowered``:    ``lo.lower(expr) @ v`` (simplified once, then one compiled program
      per shape);
  (c) ``hand``:       a hand-written ``jax.jit`` function of the raw arrays doing the same
      jnp operations (``X.T @ (K.T @ (d * (K @ (X @ v)))) + lam * v``);

plus a reference ``hand-tuned``, the same function with the transposed products written as
``lax.dot_general`` contracting dimension 0 (no ``transpose`` op), which XLA:CPU runs much
faster than ``X.T @ u`` (it is not what the goal is measured against; it shows what a
different formulation of the same math costs).

All results are checked to agree before anything is timed. Compile cost is measured on the
first call (trace, lowering and XLA compile, read from ``jax.monitoring`` events, plus the
wall time of that call). Then the methods are called in interleaved rounds (the order is
rotated each round: ABCD, BCDA, ...; garbage collection off while timing, as in
``timeit``), each call ending in ``block_until_ready()``; the report
gives the median time of each method and the median of the per-round ratios
``lowered / hand`` and ``jit-pytree / hand``. The goal is a median ratio <= 1.05.

Also reported: the number of ``dot_general`` ops in each program (``lo.count_matmuls``
before/after ``lo.simplify``, and counted in the jaxpr of each of the timed programs), and
whether calling with a freshly built operator of the same shapes and arrays recompiles.

Run:  python benchmarks/overhead.py            # full run (about 1-2 minutes on 2 cores)
      python benchmarks/overhead.py --quick    # smoke run (seconds)
      python benchmarks/overhead.py --out DIR  # write DIR/overhead.json and DIR/overhead.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import linops as lo

GOAL = 1.05
METHODS = ("jit-pytree", "lowered", "hand", "hand-tuned")

# jax.monitoring event names (jax/_src/dispatch.py); absent events are reported as None.
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# --- compile-event recorder ----------------------------------------------------------------


class CompileEvents:
    """Sums jax's trace / lower / XLA-compile durations recorded while active."""

    def __init__(self):
        self.active = False
        self.reset()
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def reset(self):
        self.trace = self.lower = self.compile = 0.0
        self.n_compiles = 0
        self.seen = False

    def _listen(self, event, duration, **_):
        if not self.active:
            return
        if event == _TRACE_EVENT:
            self.trace += duration
            self.seen = True
        elif event == _LOWER_EVENT:
            self.lower += duration
            self.seen = True
        elif event == _COMPILE_EVENT:
            self.compile += duration
            self.n_compiles += 1
            self.seen = True

    def measure(self, fn):
        """Run ``fn()`` (blocking on its result); return (output, report dict)."""
        self.reset()
        self.active = True
        t0 = time.perf_counter()
        try:
            out = fn()
            jax.block_until_ready(out)
        finally:
            wall = time.perf_counter() - t0
            self.active = False
        rep = {
            "first_call_s": wall,
            "trace_s": self.trace if self.seen else None,
            "lower_s": self.lower if self.seen else None,
            "xla_compile_s": self.compile if self.seen else None,
            "n_xla_compiles": self.n_compiles if self.seen else None,
        }
        return out, rep


# --- problem -----------------------------------------------------------------------------


def make_arrays(n: int, m: int, k: int | None, seed: int = 0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    f32 = jnp.float32
    X = jax.random.normal(keys[0], (m, n), f32) / np.sqrt(n)
    K = jax.random.normal(keys[1], (m, m), f32) / np.sqrt(m)
    d = jax.random.uniform(keys[2], (m,), f32, 0.5, 1.5)
    B = jnp.eye(m, dtype=f32) + 0.1 * jax.random.normal(keys[3], (m, m), f32) / np.sqrt(m)
    shape = (n,) if k is None else (n, k)
    v = jax.random.normal(keys[4], shape, f32)
    lam = jnp.asarray(0.1, f32)
    return dict(X=X, K=K, d=d, B=B, v=v, lam=lam)


def build_expression(name: str, a) -> lo.LinearOperator:
    """A fresh operator tree over the arrays ``a`` (new leaves, hence new leaf keys)."""
    X, K, D = lo.Dense(a["X"]), lo.Dense(a["K"]), lo.Diagonal(a["d"])
    n = a["X"].shape[1]
    if name == "chain":
        # Xᵀ Kᵀ D K X + λI: a product of 5 operators plus a scaled identity.
        return lo.shift(X.T @ K.T @ D @ K @ X, a["lam"], nonnegative=True)
    if name == "redundant":
        # The same map written with structure that `simplify` removes: identities, a
        # double transpose and B⁻¹ B (a dense solve per product unless simplified).
        B = lo.Dense(a["B"])
        inner = X.T @ K.T @ D @ lo.inv(B) @ B @ K @ X
        return lo.shift(lo.Identity(n) @ inner.T.T @ lo.Identity(n), a["lam"], nonnegative=True)
    raise ValueError(name)


EXPRESSIONS = {
    "chain": "Xᵀ Kᵀ D K X + λI",
    "redundant": "I (Xᵀ Kᵀ D B⁻¹ B K X)ᵀᵀ I + λI",
}


def _col(d, v):
    return d if v.ndim == 1 else d[:, None]


def _hand(X, K, d, lam, v):
    """What one would write by hand: the same jnp products as the operator tree."""
    return X.T @ (K.T @ (_col(d, v) * (K @ (X @ v)))) + lam * v


def _tdot(A, u):
    """``A.T @ u`` as one dot_general contracting dimension 0 of ``A`` (no transpose op)."""
    return lax.dot_general(A, u, (((0,), (0,)), ((), ())))


def _hand_tuned(X, K, d, lam, v):
    return _tdot(X, _tdot(K, _col(d, v) * (K @ (X @ v)))) + lam * v


def fresh_jit(fn):
    """``jax.jit`` of a new function object, so that no trace or compile cache is shared
    with earlier cases (each case's first call really compiles)."""
    return jax.jit(lambda *args: fn(*args))


def count_dot_general(closed_jaxpr) -> int:
    def walk(jaxpr):
        total = 0
        for eqn in jaxpr.eqns:
            total += eqn.primitive.name == "dot_general"
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # ClosedJaxpr
                        total += walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):  # Jaxpr
                        total += walk(sub)
        return total

    return walk(closed_jaxpr.jaxpr)


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


# --- one case ----------------------------------------------------------------------------


def run_case(expr_name, size, *, repeats, min_repeats, budget_s, events, log):
    n, m, k = size["n"], size["m"], size.get("k")
    a = make_arrays(n, m, k)
    v = a["v"]
    expr = build_expression(expr_name, a)
    hand_args = (a["X"], a["K"], a["d"], a["lam"], v)
    hand, hand_tuned = fresh_jit(_hand), fresh_jit(_hand_tuned)

    jit_apply = jax.jit(lambda op, x: op @ x)  # fresh per case: its first call compiles
    t0 = time.perf_counter()
    lowered = lo.lower(expr)
    lower_call_s = time.perf_counter() - t0

    calls = {
        "jit-pytree": lambda: jit_apply(expr, v),
        "lowered": lambda: lowered @ v,
        "hand": lambda: hand(*hand_args),
        "hand-tuned": lambda: hand_tuned(*hand_args),
    }

    # First calls (compile), then agreement.
    compile_rep, outs = {}, {}
    for name, fn in calls.items():
        outs[name], compile_rep[name] = events.measure(fn)
    compile_rep["lowered"]["lo.lower_s"] = lower_call_s

    errs = {name: rel_err(outs[name], outs["hand"]) for name in METHODS}
    tol = 1e-3 if expr_name == "redundant" else 1e-4  # B⁻¹ B u in float32 is not exact
    for name, e in errs.items():
        assert e <= tol, f"{expr_name} {size}: {name} disagrees with hand (rel err {e:.2e})"

    # dot_general counts.
    counts = {
        "count_matmuls_written": lo.count_matmuls(expr),
        "count_matmuls_simplified": lo.count_matmuls(lo.simplify(expr)),
        "jit-pytree": count_dot_general(jax.make_jaxpr(lambda op, x: op @ x)(expr, v)),
        "lowered": count_dot_general(jax.make_jaxpr(lambda x: lowered @ x)(v)),
        "hand": count_dot_general(jax.make_jaxpr(hand)(*hand_args)),
        "hand-tuned": count_dot_general(jax.make_jaxpr(hand_tuned)(*hand_args)),
    }

    # Warm-up, and an estimate of one round's time to fit the budget.
    t0 = time.perf_counter()
    for _ in range(3):
        for fn in calls.values():
            fn().block_until_ready()
    round_s = (time.perf_counter() - t0) / 3
    n_rounds = int(max(min_repeats, min(repeats, budget_s / max(round_s, 1e-9))))

    times = {name: [] for name in METHODS}
    order = list(METHODS)
    perf = time.perf_counter
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: no collector pauses inside the timed calls
    try:
        for r in range(n_rounds):
            rot = order[r % len(order):] + order[: r % len(order)]
            for name in rot:
                fn = calls[name]
                t = perf()
                fn().block_until_ready()
                times[name].append(perf() - t)
    finally:
        if gc_was_enabled:
            gc.enable()

    med = {name: statistics.median(ts) for name, ts in times.items()}

    def ratio_stats(name, ref="hand"):
        r = np.asarray(times[name]) / np.asarray(times[ref])
        return {"median": float(np.median(r)), "p25": float(np.percentile(r, 25)),
                "p75": float(np.percentile(r, 75))}

    ratios = {
        "lowered/hand": ratio_stats("lowered"),
        "jit-pytree/hand": ratio_stats("jit-pytree"),
        "lowered/hand-tuned": ratio_stats("lowered", "hand-tuned"),
        "hand-tuned/hand": ratio_stats("hand-tuned"),
    }

    # Does a freshly built operator (same arrays, same shapes) reuse the compiled program?
    fresh = build_expression(expr_name, a)
    _, rebuilt_jit = events.measure(lambda: jit_apply(fresh, v))
    _, rebuilt_lowered = events.measure(lambda: lo.lower(fresh) @ v)
    rebuild = {
        "jit-pytree": rebuilt_jit,
        "lowered": rebuilt_lowered,
    }

    res = {
        "expression": expr_name,
        "formula": EXPRESSIONS[expr_name],
        "n": n, "m": m, "k": k,
        "input_shape": list(v.shape),
        "rounds": n_rounds,
        "median_s": med,
        "min_s": {name: min(ts) for name, ts in times.items()},
        "ratios": ratios,
        "goal_met_lowered": ratios["lowered/hand"]["median"] <= GOAL,
        "goal_met_jit_pytree": ratios["jit-pytree/hand"]["median"] <= GOAL,
        "overhead_us_lowered_minus_hand": (med["lowered"] - med["hand"]) * 1e6,
        "overhead_us_jit_pytree_minus_hand": (med["jit-pytree"] - med["hand"]) * 1e6,
        "compile": compile_rep,
        "rebuilt_operator_first_call": rebuild,
        "dot_general": counts,
        "rel_err_vs_hand": errs,
    }
    log(f"  {expr_name:9s} {size['label']:26s} rounds={n_rounds:4d}  "
        + "  ".join(f"{nm}={med[nm] * 1e6:9.1f}us" for nm in METHODS)
        + f"  lowered/hand={ratios['lowered/hand']['median']:.3f}"
        + f"  jit/hand={ratios['jit-pytree/hand']['median']:.3f}"
        + f"  lowered/hand-tuned={ratios['lowered/hand-tuned']['median']:.3f}")
    return res


# --- report ------------------------------------------------------------------------------


def load_average():
    """The 1/5/15-minute load averages as ``"a / b / c"`` (None where the OS has none)."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return None


def machine_info():
    import equinox

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except Exception:  # pragma: no cover
        jaxlib_version = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        affinity = None
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "equinox": equinox.__version__,
        "linops": lo.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(dv) for dv in jax.devices()],
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        "dtype": "float32",
    }


def _us(x):
    return f"{x * 1e6:,.1f}"


def _s(x):
    return "n/a" if x is None else f"{x:.3f}"


def _ratio(r):
    return f"{r['median']:.3f} ({r['p25']:.2f}-{r['p75']:.2f})"


def markdown(report) -> str:
    info, cases = report["machine"], report["cases"]
    lines = [
        "# Operator-layer overhead (`benchmarks/overhead.py`)",
        "",
        f"Command: `{report['command']}`  ",
        f"Goal: median per-round ratio lowered/hand <= {GOAL}. "
        f"**Goal met in {report['summary']['lowered_goal_met']} of {len(cases)} cases "
        f"for `lowered`, {report['summary']['jit_pytree_goal_met']} of {len(cases)} for "
        f"`jit-pytree`.**",
        "",
        "Methods: **jit-pytree** `jax.jit(lambda op, v: op @ v)(expr, v)`; **lowered** "
        "`lo.lower(expr) @ v`; **hand** a `jax.jit` function of the raw arrays with the same "
        "jnp products (`X.T @ (K.T @ (d * (K @ (X @ v)))) + lam * v`); **hand-tuned** the same "
        "with transposed products as `lax.dot_general` contracting dim 0, the fastest hand-written "
        "form on XLA:CPU (`X.T @ u` compiles to a transpose copy; linops's `Dense` contracts "
        "directly, which is why `lowered` beats `hand` at mid sizes: read `lowered/hand-tuned` for "
        "the cost of the operator layer itself). X is m×n, K m×m, D = diag(d) m×m, B m×m; float32. "
        "Rounds interleave all four methods, so the `redundant` rows' `lowered` times also carry "
        "cache interference from the `jit-pytree` call, which runs a dense LU every round; timed "
        "alone the two expressions' lowered programs (the same 4 products) take the same time.",
        "",
        "## Steady state (interleaved rounds, median)",
        "",
        "| expression | size | rounds | jit-pytree µs | lowered µs | hand µs | hand-tuned µs "
        "| lowered/hand (IQR) | jit-pytree/hand (IQR) | lowered/hand-tuned (IQR) | lowered − hand µs "
        "| goal ≤ 1.05 (lowered) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for c in cases:
        md = c["median_s"]
        lines.append(
            f"| {c['formula']} | {c['label']} | {c['rounds']} | {_us(md['jit-pytree'])} | "
            f"{_us(md['lowered'])} | {_us(md['hand'])} | {_us(md['hand-tuned'])} | "
            f"{_ratio(c['ratios']['lowered/hand'])} | {_ratio(c['ratios']['jit-pytree/hand'])} | "
            f"{_ratio(c['ratios']['lowered/hand-tuned'])} | {c['overhead_us_lowered_minus_hand']:,.1f} | "
            f"{'yes' if c['goal_met_lowered'] else '**no**'} |"
        )
    lines += [
        "",
        "## Compile (first call: wall time, of which trace / lower / XLA compile from jax.monitoring), seconds",
        "",
        "| expression | size | jit-pytree | lowered (+ `lo.lower` call) | hand | hand-tuned "
        "| rebuilt operator: jit-pytree | rebuilt operator: lowered |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cc(r):
        return (f"{_s(r['first_call_s'])} ({_s(r['trace_s'])} / {_s(r['lower_s'])} / "
                f"{_s(r['xla_compile_s'])})")

    for c in cases:
        cp, rb = c["compile"], c["rebuilt_operator_first_call"]
        lines.append(
            f"| {c['formula']} | {c['label']} | {cc(cp['jit-pytree'])} | {cc(cp['lowered'])} "
            f"+ {_s(cp['lowered']['lo.lower_s'])} | {cc(cp['hand'])} | {cc(cp['hand-tuned'])} | "
            f"{_s(rb['jit-pytree']['first_call_s'])} ({rb['jit-pytree']['n_xla_compiles']} compiles) | "
            f"{_s(rb['lowered']['first_call_s'])} ({rb['lowered']['n_xla_compiles']} compiles) |"
        )
    lines += [
        "",
        "The *rebuilt operator* columns: the first call with a freshly built operator over the "
        "same arrays and shapes (new `lo.Dense(...)` leaves), after the original was compiled. "
        "A non-zero compile count means the compiled program was not reused.",
        "",
        "## dot_general count",
        "",
        "| expression | size | `lo.count_matmuls` written | after `lo.simplify` | jit-pytree program "
        "| lowered program | hand | hand-tuned |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        d = c["dot_general"]
        lines.append(
            f"| {c['formula']} | {c['label']} | {d['count_matmuls_written']} | "
            f"{d['count_matmuls_simplified']} | {d['jit-pytree']} | {d['lowered']} | {d['hand']} | "
            f"{d['hand-tuned']} |"
        )
    lines += [
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


def sizes_for(quick: bool):
    if quick:
        return [
            {"label": "n=64, m=32", "n": 64, "m": 32},
            {"label": "n=256, m=128, 4 vectors", "n": 256, "m": 128, "k": 4},
        ]
    return [
        {"label": "n=16, m=8 (dispatch only)", "n": 16, "m": 8},
        {"label": "n=512, m=256", "n": 512, "m": 256},
        {"label": "n=2048, m=512", "n": 2048, "m": 512},
        {"label": "n=2048, m=512, 16 vectors", "n": 2048, "m": 512, "k": 16},
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fast smoke run (small sizes, few repeats)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--repeats", type=int, default=None, help="max interleaved rounds per case")
    p.add_argument("--budget", type=float, default=None, help="target seconds of timing per case")
    args = p.parse_args(argv)

    repeats = args.repeats or (20 if args.quick else 400)
    budget = args.budget or (1.0 if args.quick else 6.0)
    min_repeats = min(repeats, 10 if args.quick else 100)

    events = CompileEvents()
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPUs; "
        f"up to {repeats} rounds or ~{budget:.0f}s per case (at least {min_repeats})")
    t_start = time.perf_counter()
    cases = []
    for size in sizes_for(args.quick):
        for expr_name in EXPRESSIONS:
            res = run_case(expr_name, size, repeats=repeats, min_repeats=min_repeats,
                           budget_s=budget, events=events, log=log)
            res["label"] = size["label"]
            cases.append(res)
    total = time.perf_counter() - t_start

    argv_str = " ".join(["python", "benchmarks/overhead.py"] + (sys.argv[1:] if argv is None else list(argv)))
    report = {
        "benchmark": "overhead",
        "command": argv_str,
        "goal": {"ratio": "median per-round lowered/hand", "max": GOAL},
        "quick": args.quick,
        "total_s": total,
        "summary": {
            "lowered_goal_met": sum(c["goal_met_lowered"] for c in cases),
            "jit_pytree_goal_met": sum(c["goal_met_jit_pytree"] for c in cases),
            "cases": len(cases),
            "all_met_lowered": all(c["goal_met_lowered"] for c in cases),
        },
        "machine": machine_info(),
        "cases": cases,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "overhead.md").write_text(markdown(report), encoding="utf-8")
    log(f"goal (lowered/hand <= {GOAL}) met in {report['summary']['lowered_goal_met']}/{len(cases)} "
        f"cases; total {total:.1f}s; wrote {out / 'overhead.json'} and {out / 'overhead.md'}")
    return report


if __name__ == "__main__":
    main()
