#!/usr/bin/env python
"""Laplace posteriors (``posteriors.laplace``) side by side with laplax (the JAX Laplace library,
https://github.com/laplax-org/laplax, PyPI ``laplax``) on CPU: a GGN-vector product, the diagonal
and the full Laplace fit, and the linearised predictive variance, on the same MLP.

laplax is not a dependency of this project. Install it next to the project in a separate
environment (it pins nothing but ``jax``, ``jaxtyping``, ``loguru`` and ``tqdm``)::

    python3 -m venv /tmp/laplaxenv && /tmp/laplaxenv/bin/pip install laplax -e .
    /tmp/laplaxenv/bin/python benchmarks/laplax.py

Where ``import laplax`` fails, the script says so and exits with status 0, writing nothing.

Model: a tanh MLP (``eqx.nn.MLP`` through ``linops.models.from_equinox``, float32, weights at
initialisation: the cost of a fit does not depend on where the parameters are), random standard
normal inputs with 784 features (no downloads), random labels in [0, 10), categorical likelihood
(laplax: ``loss_fn="cross_entropy"``), prior precision 1, N training and M test points. Both
libraries get the same per-example function (laplax's ``model_fn(input, params)`` is ours with
the arguments swapped) and the same params pytree.

Operations, each jitted on both sides with the arrays as arguments and compiled ahead of time
(compile time reported apart):

  ggn_mv        ours: ``jax.jit(lambda G, v: G @ v)`` with ``G = lo.GGNOp(fn, params, X, y,
                Categorical(), batch_size=N)`` (flat v); laplax: ``create_ggn_mv(model_fn, params,
                {"input": X, "target": y}, loss_fn="cross_entropy")(v)`` (v a params pytree, its
                native layout).
  diag fit      ours: ``pst.laplace(..., structure="diag")`` (the exact GGN diagonal from N·O
                reverse passes of the Hessian-factor rows); laplax: what
                ``estimate_curvature("diagonal", ggn_mv, layout=params)`` runs,
                ``CURVATURE_METHODS["diagonal"]`` (the exact diagonal from P GGN-vector products with
                basis vectors, ``laplax.util.mv.diagonal``; ``estimate_curvature`` itself calls
                ``block_until_ready`` on its result, which fails under ``jax.jit``), then
                ``set_posterior_fn(...)({"prior_prec": 1})``.
  full fit      ours: ``structure="full"`` (the dense GGN, Cholesky, covariance); laplax:
                ``CURVATURE_METHODS["full"]`` (P GGN-vector products, ``to_dense``) and its
                posterior state (a Cholesky-based scale matrix).
  diag / full predict   the linearised predictive's mean and marginal variance on M test points.
                Ours: ``pst.predictive.linearized(post, T)``; laplax: ``jax.vmap`` over the test
                inputs of ``set_lin_pushforward(..., pushforward_fns=[lin_setup, lin_pred_mean,
                lin_pred_var])`` built on the fitted posterior state (laplax's predictive is per
                input: O covariance products ``J Σ Jᵀ e_o`` by jvp / vjp; its full-covariance product
                forms ``scale @ scale.T`` inside the call).

Rounds alternate the two libraries' order; each ratio is the median (and interquartile range) of
the per-round ``laplax / ours`` measured in this one run. At least ``--rounds`` rounds (default 3),
more while a phase fits in about ``--budget`` seconds (default 20). Before any timing the two
libraries' results are checked against each other (float32, relative Frobenius errors): the GGN
product, diagonal and matrix ≤ 1e-5, the posterior (co)variance ≤ 1e-4, the predictive mean ≤ 1e-5
and variance ≤ 1e-4; on a failure the script exits with an error and writes nothing.

Run:  python benchmarks/laplax.py            # full run (a few minutes on 2 cores)
      python benchmarks/laplax.py --sizes 784-12-12-10   # a larger MLP (P = 9,706: slow for laplax)
      python benchmarks/laplax.py --quick    # smoke run (tiny model), ~30 s
      python benchmarks/laplax.py --out DIR  # write DIR/laplax.json and DIR/laplax.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import from_equinox, ravel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ggn import memory_report, ratio_stats  # noqa: E402
from overhead import load_average, machine_info, rel_err  # noqa: E402

ALPHA = 1.0  # prior precision
TOL = {"ggn": 1e-5, "posterior variance": 1e-4, "mean": 1e-5, "variance": 1e-4}
OPS = ("ggn_mv", "diag fit", "full fit", "diag predict", "full predict")


def load_laplax():
    """``(laplax modules, None)`` or ``(None, reason)``.

    This script is itself called laplax.py and its folder is on ``sys.path``: import the package
    with that folder left out, and never this file under that name.
    """
    here = Path(__file__).resolve().parent
    saved = list(sys.path)
    mod = sys.modules.get("laplax")
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve().parent == here:
        del sys.modules["laplax"]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import laplax
        from laplax.curv.cov import CURVATURE_METHODS, Posterior, set_posterior_fn
        from laplax.curv.diagonal import diagonal_posterior_state_to_cov, diagonal_posterior_state_to_scale
        from laplax.curv.full import full_posterior_state_to_cov, full_posterior_state_to_scale
        from laplax.curv.ggn import create_ggn_mv
        from laplax.eval.pushforward import lin_pred_mean, lin_pred_var, lin_setup, set_lin_pushforward
        from laplax.util.flatten import create_pytree_flattener, wrap_factory
    except Exception as e:  # noqa: BLE001 - any import failure: nothing to compare
        return None, f"laplax is not importable: {type(e).__name__}: {e}"
    finally:
        sys.path[:] = saved
    if not hasattr(laplax, "laplace"):
        return None, f"`laplax` at {getattr(laplax, '__file__', '?')} is not the laplax package"
    try:
        from loguru import logger

        logger.disable("laplax")  # its debug log lines would go to stderr in every call
    except Exception:  # noqa: BLE001
        pass
    from importlib.metadata import version

    return {
        "version": version("laplax"), "module": laplax, "Posterior": Posterior,
        "curvature_methods": CURVATURE_METHODS, "set_posterior_fn": set_posterior_fn,
        "to_cov": {"diag": diagonal_posterior_state_to_cov, "full": full_posterior_state_to_cov},
        "to_scale": {"diag": diagonal_posterior_state_to_scale, "full": full_posterior_state_to_scale},
        "create_ggn_mv": create_ggn_mv, "set_lin_pushforward": set_lin_pushforward,
        "pushforward_fns": [lin_setup, lin_pred_mean, lin_pred_var],
        "create_pytree_flattener": create_pytree_flattener, "wrap_factory": wrap_factory,
    }, None


CURV = {"diag": "diagonal", "full": "full"}  # ours -> laplax curv_type


def make_problem(sizes, n_train, n_test, seed=0):
    d, *hidden, k = sizes
    model = eqx.nn.MLP(d, k, hidden[0], len(hidden), activation=jnp.tanh, key=jax.random.key(seed))
    fn, params = from_equinox(model)
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((n_train, d)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, k, n_train))
    T = jnp.asarray(rng.standard_normal((n_test, d)).astype(np.float32))
    return fn, params, X, y, T


def build(L, fn, params, X, y, T, batch_size):
    """The two libraries' jitted functions and their arguments, per operation."""
    mfn = lambda input, params: fn(params, input)  # noqa: E731 - laplax's model_fn(input, params)
    flat, unravel = ravel(params)
    P = int(flat.shape[0])
    v = jax.random.normal(jax.random.key(1), (P,), jnp.float32)
    prior = {"prior_prec": ALPHA}

    def lx_ggn_mv(params, X, y):
        return L["create_ggn_mv"](mfn, params, {"input": X, "target": y}, loss_fn="cross_entropy")

    def lx_fit(structure):
        def f(params, X, y):
            # what `estimate_curvature` runs, less its `block_until_ready` (not allowed under jit)
            curv = L["curvature_methods"][CURV[structure]](lx_ggn_mv(params, X, y), layout=params)
            post = L["set_posterior_fn"](CURV[structure], curv, layout=params)(prior)
            return curv, post.state
        return f

    def lx_predict(structure):
        flatten, unflatten = L["create_pytree_flattener"](params)

        def f(params, state, T):
            posterior = L["Posterior"](state=state,
                                       cov_mv=L["wrap_factory"](L["to_cov"][structure], flatten, unflatten),
                                       scale_mv=L["wrap_factory"](L["to_scale"][structure], flatten, unflatten))
            pred = L["set_lin_pushforward"](mfn, params, lambda *a, **k: posterior, prior,
                                            pushforward_fns=L["pushforward_fns"])
            out = jax.vmap(pred)(T)
            return out["pred_mean"], out["pred_var"]
        return f

    def ours_fit(structure):
        return lambda params, X, y: pst.laplace(fn, params, (X, y), Categorical(), structure=structure,
                                                prior_precision=ALPHA, batch_size=batch_size)

    G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=X.shape[0])
    ops = {
        "ggn_mv": {"ours": (lambda G, v: G @ v, (G, v)),
                   "laplax": (lambda params, X, y, v: lx_ggn_mv(params, X, y)(v), (params, X, y, unravel(v)))},
        "diag fit": {"ours": (ours_fit("diag"), (params, X, y)), "laplax": (lx_fit("diag"), (params, X, y))},
        "full fit": {"ours": (ours_fit("full"), (params, X, y)), "laplax": (lx_fit("full"), (params, X, y))},
    }
    return ops, lx_predict, (lambda post, T: pst.predictive.linearized(post, T)), P, unravel


def compile_aot(fn, args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0, memory_report(compiled)


def timed(compiled, args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    return out, time.perf_counter() - t0


def rounds(calls, *, min_rounds, max_rounds, budget_s, first):
    """Interleaved rounds after the first (``first``: the first round's times), alternating the order."""
    times = {k: [first[k]] for k in calls}
    t0, r, order = time.perf_counter(), 1, list(calls)
    round_s = sum(first.values())
    while r < max_rounds and (r < min_rounds or time.perf_counter() - t0 + round_s <= budget_s):
        for k in (order if r % 2 == 0 else order[::-1]):
            times[k].append(timed(*calls[k])[1])
        r += 1
    return times


def run(cfg, L, log):
    fn, params, X, y, T = make_problem(cfg["sizes"], cfg["n_train"], cfg["n_test"])
    ops, lx_predict, ours_predict, P, unravel = build(L, fn, params, X, y, T, cfg["batch_size"])
    log(f"{'-'.join(map(str, cfg['sizes']))} tanh MLP, P={P:,}, N={cfg['n_train']}, "
        f"M={cfg['n_test']} test points; laplax {L['version']}")
    checks, fails, results = {}, [], {}

    def check(label, value, tol):
        checks[label] = {"value": float(value), "tol": tol, "ok": bool(value <= tol)}
        if not value <= tol:
            fails.append(f"{label} = {value:.2e} > {tol:.0e}")

    compiled, compile_s, memory, first_out, first_t = {}, {}, {}, {}, {}

    def prepare(op, lib, f, args):
        compiled[op, lib], compile_s[op, lib], memory[op, lib] = compile_aot(f, args)
        result, first_t[op, lib] = timed(compiled[op, lib], args)
        first_out[op, lib] = result
        log(f"  {op:12s} {lib:6s}: compile {compile_s[op, lib]:.2f}s, first run {first_t[op, lib]:.3f}s")

    args = {}
    for op, sides in ops.items():
        for lib in ("ours", "laplax"):
            f, a = sides[lib]
            args[op, lib] = a
            prepare(op, lib, f, a)
    # The predictives run on the fitted posteriors of the first round.
    for s in ("diag", "full"):
        op = f"{s} predict"
        post = first_out[f"{s} fit", "ours"]
        _, state = first_out[f"{s} fit", "laplax"]
        args[op, "ours"], args[op, "laplax"] = (post, T), (params, state, T)
        prepare(op, "ours", ours_predict, args[op, "ours"])
        prepare(op, "laplax", lx_predict(s), args[op, "laplax"])

    # Agreement, before any further timing.
    check("GGN-vector product (rel err)",
          rel_err(ravel(first_out["ggn_mv", "laplax"])[0], first_out["ggn_mv", "ours"]), TOL["ggn"])
    post_d, post_f = first_out["diag fit", "ours"], first_out["full fit", "ours"]
    curv_d, state_d = first_out["diag fit", "laplax"]
    curv_f, state_f = first_out["full fit", "laplax"]
    check("diag: GGN diagonal (rel err)", rel_err(curv_d, post_d.ggn.g), TOL["ggn"])
    check("diag: posterior variance (rel err)", rel_err(np.asarray(state_d["scale"]) ** 2,
                                                        np.diag(np.asarray(post_d.covariance.as_matrix()))),
          TOL["posterior variance"])
    check("full: GGN matrix (rel err)", rel_err(curv_f, post_f.ggn.G), TOL["ggn"])
    S = np.asarray(state_f["scale"], np.float64)
    check("full: posterior covariance, scale @ scale.T vs ours (rel err)",
          rel_err(S @ S.T, post_f.covariance.as_matrix()), TOL["posterior variance"])
    for s in ("diag", "full"):
        (m_o, v_o), (m_l, v_l) = first_out[f"{s} predict", "ours"], first_out[f"{s} predict", "laplax"]
        check(f"{s}: predictive mean (rel err)", rel_err(m_l, m_o), TOL["mean"])
        check(f"{s}: predictive variance (rel err)", rel_err(v_l, v_o), TOL["variance"])
    log("  checks: " + "; ".join(f"{k} = {v['value']:.1e}" for k, v in checks.items()))
    if fails:
        raise SystemExit("ours and laplax disagree: " + "; ".join(fails))
    first_out.clear()

    for op in OPS:
        calls = {lib: (compiled[op, lib], args[op, lib]) for lib in ("ours", "laplax")}
        times = rounds(calls, min_rounds=cfg["min_rounds"], max_rounds=cfg["max_rounds"], budget_s=cfg["budget_s"],
                       first={lib: first_t[op, lib] for lib in calls})
        r = ratio_stats(times, "laplax", "ours")
        results[op] = {"times_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()},
                       "min_s": {k: min(v) for k, v in times.items()}, "rounds": len(times["ours"]),
                       "laplax_over_ours": r,
                       "compile_s": {lib: compile_s[op, lib] for lib in calls},
                       "xla_memory": {lib: memory[op, lib] for lib in calls}}
        log(f"  {op:12s}: ours {results[op]['median_s']['ours']:.4f}s, laplax "
            f"{results[op]['median_s']['laplax']:.4f}s, laplax/ours {r['median']:.2f} ({len(times['ours'])} rounds)")
    return {"num_params": P, "checks": checks, "ops": results}


def _t(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _mb(d):
    return d.get("error", "–") if "temp_plus_output" not in d else f"{d['temp_plus_output'] / 1e6:,.1f}"


def markdown(report):
    cfg, res, info = report["config"], report["result"], report["machine"]
    lines = [
        "# Laplace posteriors vs laplax (`benchmarks/laplax.py`)",
        "",
        f"Command: `{report['command']}`  ",
        f"laplax {report['laplax_version']} (PyPI), jax {info.get('jax')}, CPU.  ",
        f"Model: {'-'.join(map(str, cfg['sizes']))} tanh MLP (`eqx.nn.MLP`, float32, weights at initialisation; "
        f"P = {res['num_params']:,}), N = {cfg['n_train']:,} random standard-normal inputs with random labels in "
        f"[0, 10), categorical likelihood (laplax: `loss_fn=\"cross_entropy\"`), prior precision 1, "
        f"M = {cfg['n_test']} test points; ours fits with `batch_size={cfg['batch_size']}`, laplax takes the "
        "whole data set as one batch (its default for an array).",
        "",
        "## Time (steady state, both sides `jax.jit`-compiled ahead)",
        "",
        "Median seconds over the rounds; *laplax / ours* is the median (interquartile range) of the per-round "
        "ratios, rounds alternating the two libraries' order. Above 1: ours is faster.",
        "",
        "| operation | ours | laplax | laplax / ours | rounds | compile ours / laplax | XLA temp + output MB, "
        "ours / laplax |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        o = res["ops"][op]
        r = o["laplax_over_ours"]
        lines.append(f"| {op} | {_t(o['median_s']['ours'])} | {_t(o['median_s']['laplax'])} | "
                     f"{r['median']:.2f} ({r['p25']:.2f}–{r['p75']:.2f}) | {o['rounds']} | "
                     f"{o['compile_s']['ours']:.2f} / {o['compile_s']['laplax']:.2f} s | "
                     f"{_mb(o['xla_memory']['ours'])} / {_mb(o['xla_memory']['laplax'])} |")
    lines += [
        "",
        "What each side computes:",
        "",
        "- *ggn_mv*: both a jvp, the softmax Hessian product and a vjp over the N examples "
        "(ours `lo.GGNOp` on a flat vector, laplax `create_ggn_mv` on a params pytree).",
        "- *diag fit*: ours, the exact diagonal from N·O reverse passes of the Hessian-factor rows; laplax, the "
        "exact diagonal from P GGN-vector products with basis vectors (`laplax.util.mv.diagonal`, one `lax.map` "
        "step per parameter).",
        "- *full fit*: ours, the dense GGN from the N·O Hessian-factor rows (one matrix product), then Cholesky "
        "and the covariance; laplax, the dense GGN from P GGN-vector products (`to_dense`), then its scale "
        "matrix (a Cholesky factor of the flipped precision and a triangular solve).",
        "- *predict*: ours, the test Jacobian's rows by reverse passes and `diag(J Σ Jᵀ)`; laplax, per test "
        "input (vmapped) O products `J Σ Jᵀ e_o` by jvp / vjp, its full covariance formed as "
        "`scale @ scale.T` inside the call.",
        "",
        "## Agreement (checked on the first round, before the others)",
        "",
        "| check | value | tolerance | ok |",
        "|---|---:|---:|:---:|",
    ]
    for k, v in res["checks"].items():
        lines.append(f"| {k} | {v['value']:.2e} | {v['tol']:.0e} | {'yes' if v['ok'] else '**no**'} |")
    lines += ["", "## What this shows", ""]
    if report["quick"]:
        lines.append("Smoke run (`--quick`, tiny model): the numbers are not meant to be read.")
    else:
        for op in OPS:
            q = res["ops"][op]["laplax_over_ours"]
            r = q["median"]
            if q["p25"] <= 1 <= q["p75"]:
                verdict = "no clear difference: the interquartile range of the per-round ratios contains 1"
            else:
                verdict = f"ours {r:.2f}× faster" if r >= 1 else f"laplax {1 / r:.2f}× faster"
            lines.append(f"- **{op}**: {verdict} (laplax / ours = {r:.2f}, IQR {q['p25']:.2f}–{q['p75']:.2f}).")
        lines += ["", "Where the time goes: laplax's exact diagonal and dense GGN cost P GGN-vector products, one "
                  "per parameter, so its diag fit grows as P · N while ours grows as N · O (reverse passes of the "
                  "Hessian-factor rows); for the dense GGN, ours multiplies the N·O rows (2·N·O·P² flops, one large "
                  "matrix product), against about 6·N·P² flops in laplax's P products (one `lax.map` step each): "
                  "more arithmetic for O = 10 outputs, done more efficiently. For the predictive, laplax "
                  "runs O jvp / vjp pairs per test input against the covariance (cheap for a diagonal Σ), while "
                  "ours materialises the M·O test-Jacobian rows; for a dense Σ laplax also forms "
                  "`scale @ scale.T` (2P³ flops) inside every call.",
                  "", f"The machine is shared (load average at start / end: "
                  f"{info.get('load average at start (1/5/15 min)')} and {info.get('load average at end (1/5/15 min)')}"
                  "): read the per-round ratios, not single medians."]
    lines += ["", "## Machine", "", "| key | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fast smoke run (tiny model)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--rounds", type=int, default=None, help="at least this many rounds per operation (default 3)")
    p.add_argument("--budget", type=float, default=None, help="seconds of rounds per operation (default 20)")
    p.add_argument("--sizes", default=None, help="layer widths, e.g. 784-12-12-10 (equal hidden widths; "
                   "default 128-16-16-10, 64-8-8-10 with --quick)")
    args = p.parse_args(argv)

    L, reason = load_laplax()
    if L is None:
        print(f"benchmarks/laplax.py: skipped, {reason}. Install it beside this project, e.g. "
              "`python3 -m venv /tmp/laplaxenv && /tmp/laplaxenv/bin/pip install laplax -e .`.")
        return 0
    if args.quick:
        cfg = {"sizes": [64, 8, 8, 10], "n_train": 128, "n_test": 16, "batch_size": 64,
               "min_rounds": 2, "max_rounds": 3, "budget_s": 0.5}
    else:
        # laplax forms the diagonal and the dense GGN from P GGN-vector products (one per parameter),
        # so P stays in the thousands: at P = 9,706 (784-12-12-10) one laplax diag fit takes minutes.
        cfg = {"sizes": [128, 16, 16, 10], "n_train": 1024, "n_test": 256, "batch_size": 256,
               "min_rounds": 3, "max_rounds": 200, "budget_s": 20.0}
    if args.sizes:
        cfg["sizes"] = [int(x) for x in args.sizes.split("-")]
    if args.rounds:
        cfg["min_rounds"] = args.rounds
        cfg["max_rounds"] = max(cfg["max_rounds"], args.rounds)
    if args.budget is not None:
        cfg["budget_s"] = args.budget

    t_start = time.perf_counter()
    log = lambda s: print(f"[{time.perf_counter() - t_start:6.1f}s] {s}", flush=True)  # noqa: E731
    load_start = load_average()
    result = run(cfg, L, log)
    machine = machine_info()
    machine.update({"laplax": L["version"], "load average at start (1/5/15 min)": load_start,
                    "load average at end (1/5/15 min)": load_average()})
    report = {
        "benchmark": "laplax",
        "command": " ".join(["python", "benchmarks/laplax.py"] + (sys.argv[1:] if argv is None else list(argv))),
        "laplax_version": L["version"],
        "quick": args.quick,
        "tolerances": TOL,
        "total_s": time.perf_counter() - t_start,
        "config": cfg,
        "summary": {op: result["ops"][op]["laplax_over_ours"]["median"] for op in OPS},
        "machine": machine,
        "result": result,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "laplax.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    (out / "laplax.md").write_text(markdown(report), encoding="utf-8")
    log(f"total {report['total_s']:.1f}s; wrote {out / 'laplax.json'} and {out / 'laplax.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
