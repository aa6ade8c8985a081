#!/usr/bin/env python
"""Laplace posteriors (``posteriors.laplace``) side by side with laplax (https://github.com/laplax-org/laplax,
PyPI ``laplax``, the JAX Laplace library) on CPU: a GGN-vector product, the diagonal and full fits, and
their linearised predictives, on the same tanh MLP (same per-example function and params pytree).

laplax is not a dependency of this project: install it beside the project in a separate environment
(``python3 -m venv /tmp/laplaxenv && /tmp/laplaxenv/bin/pip install laplax -e .``). Where ``import laplax``
fails, the script says so and exits with status 0, writing nothing. Both sides are jitted and compiled
ahead; rounds alternate the libraries; ratios are medians of per-round laplax / ours. The two must agree
first (GGN product, diagonal and matrix ≤ 1e-5, posterior (co)variance ≤ 1e-4, predictive mean ≤ 1e-5,
variance ≤ 1e-4) or the script exits writing nothing. See ``benchmarks/README.md``.

Run:  /tmp/laplaxenv/bin/python benchmarks/vs_laplax.py            # full run (a few minutes on 2 cores)
      /tmp/laplaxenv/bin/python benchmarks/vs_laplax.py --quick    # smoke run (tiny model), ~30 s
      /tmp/laplaxenv/bin/python benchmarks/vs_laplax.py --sizes 784-12-12-10   # P = 9,706: slow for laplax
"""

from __future__ import annotations

import sys

import _harness as H
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import ravel

ALPHA = 1.0  # prior precision
TOL = {"ggn": 1e-5, "posterior variance": 1e-4, "mean": 1e-5, "variance": 1e-4}
OPS = ("ggn_mv", "diag fit", "full fit", "diag predict", "full predict")
CURV = {"diag": "diagonal", "full": "full"}  # ours -> laplax curv_type


def load_laplax():
    """``(laplax modules, None)`` or ``(None, reason)``."""
    try:
        from laplax.curv.cov import CURVATURE_METHODS, Posterior, set_posterior_fn
        from laplax.curv.diagonal import diagonal_posterior_state_to_cov, diagonal_posterior_state_to_scale
        from laplax.curv.full import full_posterior_state_to_cov, full_posterior_state_to_scale
        from laplax.curv.ggn import create_ggn_mv
        from laplax.eval.pushforward import lin_pred_mean, lin_pred_var, lin_setup, set_lin_pushforward
        from laplax.util.flatten import create_pytree_flattener, wrap_factory
    except Exception as e:  # noqa: BLE001 - any import failure: nothing to compare
        return None, f"laplax is not importable: {type(e).__name__}: {e}"
    try:
        from loguru import logger

        logger.disable("laplax")  # its debug log lines would go to stderr in every call
    except Exception:  # noqa: BLE001
        pass
    from importlib.metadata import version

    return {
        "version": version("laplax"), "Posterior": Posterior, "curvature_methods": CURVATURE_METHODS,
        "set_posterior_fn": set_posterior_fn,
        "to_cov": {"diag": diagonal_posterior_state_to_cov, "full": full_posterior_state_to_cov},
        "to_scale": {"diag": diagonal_posterior_state_to_scale, "full": full_posterior_state_to_scale},
        "create_ggn_mv": create_ggn_mv, "set_lin_pushforward": set_lin_pushforward,
        "pushforward_fns": [lin_setup, lin_pred_mean, lin_pred_var],
        "create_pytree_flattener": create_pytree_flattener, "wrap_factory": wrap_factory,
    }, None


def build(L, fn, params, X, y, T, batch_size):
    """The two libraries' jitted functions and their arguments, per operation."""
    mfn = lambda input, params: fn(params, input)  # laplax's model_fn(input, params)
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
    return ops, lx_predict, (lambda post, T: pst.predictive.linearized(post, T)), P


def measure(cfg, L, log):
    _, fn, params, X, y, T = H.eqx_problem(cfg["sizes"], cfg["n_train"], cfg["n_test"])
    X, y, T = jnp.asarray(X), jnp.asarray(y), jnp.asarray(T)
    ops, lx_predict, ours_predict, P = build(L, fn, params, X, y, T, cfg["batch_size"])
    log(f"{'-'.join(map(str, cfg['sizes']))} tanh MLP, P={P:,}, N={cfg['n_train']}, "
        f"M={cfg['n_test']} test points; laplax {L['version']}")
    check, results = H.Checks(), {}

    compiled, compile_s, memory, first_out, first_t, args = {}, {}, {}, {}, {}, {}

    def prepare(op, lib, f, a):
        args[op, lib] = a
        compiled[op, lib], compile_s[op, lib], memory[op, lib] = H.compile_aot(f, *a)
        first_out[op, lib], first_t[op, lib] = H.timed(lambda: compiled[op, lib](*a))
        log(f"  {op:12s} {lib:6s}: compile {compile_s[op, lib]:.2f}s, first run {first_t[op, lib]:.3f}s")

    for op, sides in ops.items():
        for lib in ("ours", "laplax"):
            prepare(op, lib, *sides[lib])
    for s in ("diag", "full"):  # the predictives run on the fitted posteriors of the first round
        prepare(f"{s} predict", "ours", ours_predict, (first_out[f"{s} fit", "ours"], T))
        prepare(f"{s} predict", "laplax", lx_predict(s), (params, first_out[f"{s} fit", "laplax"][1], T))

    # Agreement, before any further timing.
    check("GGN-vector product (rel err)",
          H.rel_err(ravel(first_out["ggn_mv", "laplax"])[0], first_out["ggn_mv", "ours"]), TOL["ggn"])
    post_d, post_f = first_out["diag fit", "ours"], first_out["full fit", "ours"]
    (curv_d, state_d), (curv_f, state_f) = first_out["diag fit", "laplax"], first_out["full fit", "laplax"]
    check("diag: GGN diagonal (rel err)", H.rel_err(curv_d, post_d.ggn.g), TOL["ggn"])
    check("diag: posterior variance (rel err)", H.rel_err(np.asarray(state_d["scale"]) ** 2,
                                                          np.diag(np.asarray(post_d.covariance.as_matrix()))),
          TOL["posterior variance"])
    check("full: GGN matrix (rel err)", H.rel_err(curv_f, post_f.ggn.G), TOL["ggn"])
    S = np.asarray(state_f["scale"], np.float64)
    check("full: posterior covariance, scale @ scale.T vs ours (rel err)",
          H.rel_err(S @ S.T, post_f.covariance.as_matrix()), TOL["posterior variance"])
    for s in ("diag", "full"):
        (m_o, v_o), (m_l, v_l) = first_out[f"{s} predict", "ours"], first_out[f"{s} predict", "laplax"]
        check(f"{s}: predictive mean (rel err)", H.rel_err(m_l, m_o), TOL["mean"])
        check(f"{s}: predictive variance (rel err)", H.rel_err(v_l, v_o), TOL["variance"])
    log("  checks: " + "; ".join(f"{k} = {v['value']:.1e}" for k, v in check.items()))
    if check.failed:
        raise SystemExit("ours and laplax disagree: " + "; ".join(check.failed))
    first_out.clear()

    for op in OPS:
        calls = {lib: (lambda c=compiled[op, lib], a=args[op, lib]: c(*a)) for lib in ("ours", "laplax")}
        times, n_rounds = H.rounds(calls, times={lib: [first_t[op, lib]] for lib in calls},
                                   min_rounds=cfg["min_rounds"], max_rounds=cfg["max_rounds"], budget_s=cfg["budget_s"])
        r = H.ratio(times, "laplax", "ours")
        results[op] = {"times_s": times, "median_s": H.medians(times), "min_s": H.minimums(times), "rounds": n_rounds,
                       "laplax_over_ours": r, "compile_s": {lib: compile_s[op, lib] for lib in calls},
                       "xla_memory": {lib: memory[op, lib] for lib in calls}}
        log(f"  {op:12s}: ours {results[op]['median_s']['ours']:.4f}s, laplax "
            f"{results[op]['median_s']['laplax']:.4f}s, laplax/ours {r['median']:.2f} ({n_rounds} rounds)")
    return {"num_params": P, "checks": dict(check), "ops": results}


def _t(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _mb(d):
    return d.get("error", "–") if "temp_plus_output" not in d else f"{d['temp_plus_output'] / 1e6:,.1f}"


def reading(report):
    if report["quick"]:
        return ["Smoke run (`--quick`, tiny model): the numbers are not meant to be read."]
    out = []
    for op in OPS:
        q = report["result"]["ops"][op]["laplax_over_ours"]
        r = q["median"]
        if q["p25"] <= 1 <= q["p75"]:
            verdict = "no clear difference: the interquartile range of the per-round ratios contains 1"
        else:
            verdict = f"ours {r:.2f}× faster" if r >= 1 else f"laplax {1 / r:.2f}× faster"
        out.append(f"- **{op}**: {verdict} (laplax / ours = {r:.2f}, IQR {q['p25']:.2f}–{q['p75']:.2f}).")
    info = report["machine"]
    return out + [
        "", "Where the time goes: laplax's exact diagonal and dense GGN cost P GGN-vector products, one "
        "per parameter, so its diag fit grows as P · N while ours grows as N · O (reverse passes of the "
        "Hessian-factor rows); for the dense GGN, ours multiplies the N·O rows (2·N·O·P² flops, one large "
        "matrix product), against about 6·N·P² flops in laplax's P products (one `lax.map` step each): "
        "more arithmetic for O = 10 outputs, done more efficiently. For the predictive, laplax "
        "runs O jvp / vjp pairs per test input against the covariance (cheap for a diagonal Σ), while "
        "ours materialises the M·O test-Jacobian rows; for a dense Σ laplax also forms "
        "`scale @ scale.T` (2P³ flops) inside every call.",
        "", f"The machine is shared (load average at start / end: {info.get('load average at start (1/5/15 min)')} "
        f"and {info.get('load average at end (1/5/15 min)')}): read the per-round ratios, not single medians."]


def markdown(report):
    cfg, res = report["config"], report["result"]
    return H.render(H.head("Laplace posteriors vs laplax", report) + [
        f"laplax {report['laplax_version']} (PyPI), jax {report['machine'].get('jax')}, CPU.  ",
        f"Model: {'-'.join(map(str, cfg['sizes']))} tanh MLP (`eqx.nn.MLP`, float32, weights at initialisation; "
        f"P = {res['num_params']:,}), N = {cfg['n_train']:,} random standard-normal inputs with random labels in "
        f"[0, 10), categorical likelihood (laplax: `loss_fn=\"cross_entropy\"`), prior precision 1, "
        f"M = {cfg['n_test']} test points; ours fits with `batch_size={cfg['batch_size']}`, laplax takes the "
        "whole data set as one batch (its default for an array).",
        *H.section("Time (steady state, both sides `jax.jit`-compiled ahead)"),
        "Median seconds over the rounds; *laplax / ours* is the median (interquartile range) of the per-round "
        "ratios, rounds alternating the two libraries' order. Above 1: ours is faster.",
        *H.table(("operation", "ours", "laplax", "laplax / ours", "rounds", "compile ours / laplax",
                  "XLA temp + output MB, ours / laplax"),
                 [(op, _t(o["median_s"]["ours"]), _t(o["median_s"]["laplax"]), H.iqr(o["laplax_over_ours"], 2, "–"),
                   o["rounds"], f"{o['compile_s']['ours']:.2f} / {o['compile_s']['laplax']:.2f} s",
                   f"{_mb(o['xla_memory']['ours'])} / {_mb(o['xla_memory']['laplax'])}")
                  for op, o in ((op, res["ops"][op]) for op in OPS)]),
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
        *H.section("Agreement (checked on the first round, before the others)"),
        *H.table(("check", "value", "tolerance", "ok"),
                 [(k, f"{v['value']:.2e}", f"{v['tol']:.0e}", H.yes(v["ok"])) for k, v in res["checks"].items()],
                 "lrrc"),
        *H.section("What this shows"),
        *reading(report),
    ] + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv, rounds=(int, "at least this many rounds per operation (default 3)"),
                budget=(float, "seconds of rounds per operation (default 20)"),
                sizes=(str, "layer widths, e.g. 784-12-12-10 (equal hidden widths; default 128-16-16-10, "
                            "64-8-8-10 with --quick)"))
    L, reason = load_laplax()
    if L is None:
        run.log(f"benchmarks/vs_laplax.py: skipped, {reason}. Install it beside this project, e.g. "
                "`python3 -m venv /tmp/laplaxenv && /tmp/laplaxenv/bin/pip install laplax -e .`.")
        return 0
    a = run.args
    if run.quick:
        cfg = {"sizes": [64, 8, 8, 10], "n_train": 128, "n_test": 16, "batch_size": 64,
               "min_rounds": 2, "max_rounds": 3, "budget_s": 0.5}
    else:
        # laplax forms the diagonal and the dense GGN from P GGN-vector products (one per parameter),
        # so P stays in the thousands: at P = 9,706 (784-12-12-10) one laplax diag fit takes minutes.
        cfg = {"sizes": [128, 16, 16, 10], "n_train": 1024, "n_test": 256, "batch_size": 256,
               "min_rounds": 3, "max_rounds": 200, "budget_s": 20.0}
    if a.sizes:
        cfg["sizes"] = [int(x) for x in a.sizes.split("-")]
    if a.rounds:
        cfg["min_rounds"], cfg["max_rounds"] = a.rounds, max(cfg["max_rounds"], a.rounds)
    if a.budget is not None:
        cfg["budget_s"] = a.budget
    result = measure(cfg, L, run.log)
    run.write({"laplax_version": L["version"], "tolerances": TOL, "config": cfg,
               "summary": {op: result["ops"][op]["laplax_over_ours"]["median"] for op in OPS}, "result": result},
              markdown, machine={"laplax": L["version"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
