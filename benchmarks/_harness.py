"""What every benchmark script shares: the command line, timing rounds, first-call (compile) timing,
XLA's memory analysis, machine facts, Markdown tables, and writing ``NAME.json`` / ``NAME.md``.

A script is run as ``python benchmarks/NAME.py``: its folder is then on ``sys.path``, so it does
``import _harness as H`` (the leading underscore keeps this module from shadowing any package).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import linops as lo

RESULTS = Path(__file__).resolve().parent / "results"

# --- the command line, the log, and the results files ------------------------------------


class Run:
    """One run of a script: its arguments (``--quick``, ``--out DIR`` and the script's own options,
    given as ``name=(type, help)``, ``bool`` for a flag), a timestamped log, and ``write``."""

    def __init__(self, script, doc, argv=None, **options):
        self.name = Path(script).stem
        p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
        p.add_argument("--quick", action="store_true", help="smoke run: small sizes, few rounds (not to be read)")
        p.add_argument("--out", type=Path, default=RESULTS, help="output directory (default: benchmarks/results)")
        for name, (typ, help_) in options.items():
            kind = {"action": "store_true"} if typ is bool else {"type": typ}
            p.add_argument("--" + name.replace("_", "-"), help=help_, **kind)
        self.args = p.parse_args(argv)
        self.quick = self.args.quick
        self.command = " ".join(["python", f"benchmarks/{self.name}.py", *(sys.argv[1:] if argv is None else argv)])
        self.t0 = time.perf_counter()
        self.load_start = load_average()
        self.log(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPUs, {jax.device_count()} "
                 f"device(s); load average {self.load_start}")

    def log(self, msg):
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def write(self, report, markdown, machine=None):
        """Completes ``report`` (benchmark, command, quick, total_s, machine) and writes it as JSON and as
        ``markdown(report)`` into ``--out``; returns the completed report."""
        report = {"benchmark": self.name, "command": self.command, "quick": self.quick,
                  "total_s": time.perf_counter() - self.t0, **report,
                  "machine": machine_info(**{"load average at start (1/5/15 min)": self.load_start,
                                             "load average at end (1/5/15 min)": load_average(), **(machine or {})})}
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{self.name}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
        (out / f"{self.name}.md").write_text(markdown(report), encoding="utf-8")
        self.log(f"total {report['total_s']:.1f}s; wrote {out / self.name}.json and .md")
        return report


def load_average():
    """The 1/5/15-minute load averages as ``"a / b / c"`` (None where the OS has none)."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return None


def machine_info(**extra):
    import equinox
    import jaxlib

    cpu_model = cpu_id = None
    if os.path.exists("/proc/cpuinfo"):  # the first processor's: a model name alone ("AMD EPYC") hides which
        with open("/proc/cpuinfo") as fh:  # generation ran, and these machines vary from day to day
            first = dict(line.split(":", 1) for line in fh.read().split("\n\n")[0].splitlines() if ":" in line)
        first = {k.strip(): v.strip() for k, v in first.items()}
        cpu_model = first.get("model name")
        flags = set(first.get("flags", "").split())
        cpu_id = (f"family {first.get('cpu family', '?')} model {first.get('model', '?')}, "
                  f"{'AVX-512' if 'avx512f' in flags else 'AVX2' if 'avx2' in flags else 'no AVX2'}, "
                  f"{first.get('cache size', '?')} cache")
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "equinox": equinox.__version__, "linops": lo.__version__, "platform": platform.platform(),
        "machine": platform.machine(), "cpu_model": cpu_model, "cpu_id": cpu_id, "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"), "dtype": "float32", **extra,
    }


# --- first calls, compiled programs, memory ----------------------------------------------

# jax.monitoring event names (jax/_src/dispatch.py) -> the keys of a first-call report.
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "xla_compile_s"}
_recording: list[dict] = []


def _listen(event, duration, **_):
    if _recording and event in _EVENTS:
        rep = _recording[-1]
        for k in (*_EVENTS.values(), "n_xla_compiles"):
            rep[k] = rep[k] or 0
        rep[_EVENTS[event]] += duration
        rep["n_xla_compiles"] += event.endswith("backend_compile_duration")


jax.monitoring.register_event_duration_secs_listener(_listen)


def first_call(fn, block=lambda out: out):
    """Run ``fn()`` and block on ``block(output)``: ``(output, report)``, the report the wall time
    (``first_call_s``) and, where ``jax.monitoring`` recorded them, the trace / lowering / XLA compile
    seconds and the number of XLA compiles (all None where no event came)."""
    rep = {"first_call_s": None, "trace_s": None, "lower_s": None, "xla_compile_s": None, "n_xla_compiles": None}
    _recording.append(rep)
    t0 = time.perf_counter()
    try:
        out = fn()
        jax.block_until_ready(block(out))
    finally:
        rep["first_call_s"] = time.perf_counter() - t0
        _recording.pop()
    return out, rep


def first_calls(calls):
    """``first_call`` of each of ``calls`` (a dict of thunks): ``({name: output}, {name: report})``."""
    done = {k: first_call(fn) for k, fn in calls.items()}
    return {k: d[0] for k, d in done.items()}, {k: d[1] for k, d in done.items()}


def timed(fn):
    """``(fn() blocked on, seconds)``."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def fresh_jit(fn):
    """``jax.jit`` of a new function object: no trace or compile cache shared with earlier cases."""
    return jax.jit(lambda *args: fn(*args))


def compile_aot(fn, *args):
    """``jax.jit(fn)`` lowered and compiled for ``args`` (arrays or ShapeDtypeStructs), not run:
    ``(compiled, seconds, memory(compiled))``."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0, memory(compiled)


def memory(compiled):
    """XLA's memory analysis (bytes) of a compiled program, or of the one a thunk compiles; on
    failure ``{"error": ...}`` (reported, the benchmark goes on)."""
    try:
        analysis = (compiled if hasattr(compiled, "memory_analysis") else compiled()).memory_analysis()
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    if analysis is None:
        return {"error": "memory_analysis() returned None on this backend"}
    rep = {k: int(getattr(analysis, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                  "temp_size_in_bytes", "alias_size_in_bytes",
                                                  "generated_code_size_in_bytes")}
    rep["temp_plus_output"] = rep["temp_size_in_bytes"] + rep["output_size_in_bytes"]
    rep["total"] = rep["temp_plus_output"] + rep["argument_size_in_bytes"]
    return rep


# --- timing rounds -----------------------------------------------------------------------


def _block_time(name, fn):
    t = time.perf_counter()
    out = fn()
    out.block_until_ready() if hasattr(out, "block_until_ready") else jax.block_until_ready(out)
    return time.perf_counter() - t


def rounds(calls, *, min_rounds=1, max_rounds=10**9, budget_s=0.0, warmup=0, reverse=False, times=None,
           timer=_block_time):
    """Interleaved rounds: each round calls every one of ``calls`` once, each call blocked on its
    result, the order rotated each round (``reverse``: reversed every other round), gc off while
    timing (as in ``timeit``). After ``warmup`` untimed rounds: at least ``min_rounds``, at most
    ``max_rounds``, and more while the next round (as long as the mean so far) fits in ``budget_s``
    seconds. ``times`` holds rounds already measured, to extend (they count as rounds, not against the
    budget); ``timer(name, fn)`` returns a call's seconds. Returns ``({name: [seconds]}, rounds)``."""
    names = list(calls)
    times = {k: [] for k in names} if times is None else times
    for _ in range(warmup):
        for fn in calls.values():
            jax.block_until_ready(fn())
    r = len(times[names[0]])
    spent = sum(sum(times[k]) for k in names)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    try:
        while r < max_rounds and (r < min_rounds or time.perf_counter() - t0 + spent / max(r, 1) <= budget_s):
            k = r % len(names)
            order = (names[::-1] if r % 2 else names) if reverse else names[k:] + names[:k]
            for name in order:
                times[name].append(timer(name, calls[name]))
                spent += times[name][-1]
            r += 1
    finally:
        if was_enabled:
            gc.enable()
    return times, r


def ratio(times, num, den):
    """Median and quartiles of the per-round ratios ``times[num] / times[den]``."""
    r = np.asarray(times[num]) / np.asarray(times[den])
    return {"median": float(np.median(r)), "p25": float(np.percentile(r, 25)), "p75": float(np.percentile(r, 75))}


def medians(times):
    return {k: float(np.median(v)) for k, v in times.items()}


def minimums(times):
    return {k: min(v) for k, v in times.items()}


class Checks(dict):
    """Agreement checks: ``checks(label, value, tol)`` records ``{"value", "tol", "ok"}`` under ``label``;
    ``failed`` lists those above their tolerance."""

    def __init__(self):
        super().__init__()
        self.failed = []

    def __call__(self, label, value, tol):
        self[label] = {"value": float(value), "tol": tol, "ok": bool(value <= tol)}
        if not value <= tol:
            self.failed.append(f"{label} = {value:.2e} > {tol:.0e}")


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def tree_rel_err(a, b) -> float:
    flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])
    return rel_err(flat(a), flat(b))


# --- models shared by several scripts ----------------------------------------------------


def mlp_params(key, sizes):
    """``{"W0", "b0", ...}``: ``W_i`` of shape ``(in, out)`` scaled by ``1/sqrt(in)``, small random biases."""
    keys = jax.random.split(key, len(sizes) - 1)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        params[f"W{i}"] = jax.random.normal(keys[i], (a, b), jnp.float32) / np.sqrt(a)
        params[f"b{i}"] = 0.1 * jax.random.normal(jax.random.fold_in(keys[i], 1), (b,), jnp.float32)
    return params


def mlp_fn(num_layers):
    """The per-example model ``fn(params, x) -> (O,)`` over ``mlp_params``: tanh hidden layers, linear output."""

    def fn(params, x):
        h = x
        for i in range(num_layers):
            h = h @ params[f"W{i}"] + params[f"b{i}"]
            h = jnp.tanh(h) if i < num_layers - 1 else h
        return h

    return fn


def batched(fn):
    return jax.vmap(fn, in_axes=(None, 0))


def mean_nll(out, y):
    """The mean categorical negative log-likelihood of logits ``out`` (N, O) and integer labels ``y``."""
    return jnp.mean(jax.nn.logsumexp(out, axis=-1) - jnp.take_along_axis(out, y[:, None], axis=1)[:, 0])


def eqx_problem(sizes, n_train, n_test, seed=0):
    """An ``eqx.nn.MLP`` (tanh, equal hidden widths) through ``from_equinox``, and numpy data: standard
    normal inputs ``X`` (n_train) and ``T`` (n_test), labels in ``[0, O)``: ``(model, fn, params, X, y, T)``."""
    import equinox as eqx

    from linops.models import from_equinox

    d, *hidden, k = sizes
    if len(set(hidden)) != 1:
        raise ValueError(f"eqx.nn.MLP needs equal hidden widths, got {sizes}")
    model = eqx.nn.MLP(d, k, hidden[0], len(hidden), activation=jnp.tanh, key=jax.random.key(seed))
    fn, params = from_equinox(model)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_train, d)).astype(np.float32)
    y = rng.integers(0, k, n_train)
    T = rng.standard_normal((n_test, d)).astype(np.float32)
    return model, fn, params, X, y, T


# --- Markdown ----------------------------------------------------------------------------


def table(head, rows, align=None):
    """A Markdown table (with a blank line either side): ``head`` the column titles, ``align`` a letter per
    column (``l``, ``r``, ``c``; default: the first left, the others right)."""
    align = align or "l" + "r" * (len(head) - 1)
    sep = {"l": "---", "r": "---:", "c": ":---:"}
    return (["", "| " + " | ".join(head) + " |", "|" + "|".join(sep[a] for a in align) + "|"]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""])


COMPILE = "Compile (first call: wall time, of which trace / lower / XLA compile from jax.monitoring), seconds"


def section(title):
    return ["", f"## {title}", ""]


def head(title, report):
    return [f"# {title} (`benchmarks/{report['benchmark']}.py`)", "", f"Command: `{report['command']}`  "]


def machine(report):
    return [*section("Machine"), *table(("key", "value"), report["machine"].items(), "ll")]


def render(lines):
    """The report's lines as Markdown text, runs of blank lines folded into one."""
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"


def iqr(r, digits=3, dash="-"):
    """A ratio's median with its interquartile range."""
    return f"{r['median']:.{digits}f} ({r['p25']:.2f}{dash}{r['p75']:.2f})"


def yes(met):
    return "n/a" if met is None else ("yes" if met else "**no**")


def s(x, digits=3):
    return "n/a" if x is None else f"{x:.{digits}f}"


def ms(x, digits=1):
    return f"{x * 1e3:,.{digits}f}"


def mb(nbytes, digits=1):
    return "n/a" if nbytes is None else f"{nbytes / 1e6:,.{digits}f}"
