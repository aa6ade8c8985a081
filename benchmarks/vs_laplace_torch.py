#!/usr/bin/env python
"""Laplace posteriors (``posteriors.laplace``): fit and predictive time and memory per structure,
side by side with laplace-torch on CPU.

tanh MLPs (``eqx.nn.MLP``, float32, weights at initialisation), N = 1,024 random 784-feature inputs with
random labels in [0, 10), categorical likelihood, prior precision 1, 256 test points; laplace-torch gets
the same weights (``torch.nn.Sequential``) and data (a ``DataLoader`` with our batch size). Cases: full
(784-12-12-10), diag, last_layer, kfac and lowrank (784-128-128-10; lowrank ours alone). Timed: the fit
(``pst.laplace`` vs ``Laplace(...)`` + ``la.fit``) and the linearised predictive with probit probabilities;
ours as called (eager, compile split out) and compiled ahead; rounds alternate the libraries, ratios are
medians of per-round torch / ours (**goals: fit ≥ 3×, predictive ≥ 10×**). Memory: XLA's analysis of our
programs and the peak RSS of every call. The two libraries must agree (GGN ≤ 1e-5, mean ≤ 1e-5, variance
≤ 1e-4, probabilities ≤ 1e-6) on the first round, or the script exits writing nothing. Without
laplace-torch (or with ``--no-torch``) it times ours alone and says so. See ``benchmarks/README.md``.

Run:  python benchmarks/vs_laplace_torch.py              # full run (about 10-12 minutes on 2 cores)
      python benchmarks/vs_laplace_torch.py --quick      # smoke run (small models; about a minute)
      python benchmarks/vs_laplace_torch.py --no-torch   # ours alone, as where laplace-torch is not installed
"""

from __future__ import annotations

import math
import time
import warnings

import _harness as H
import _processes as procs
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import ravel
from posteriors.experiments.methods import LAPLACE_AXES

GOAL_FIT = 3.0       # laplace-torch fit time / ours
GOAL_PREDICT = 10.0  # laplace-torch predictive time / ours
ALPHA = 1.0          # prior precision
# Agreement tolerances (float32 on both sides, relative Frobenius-norm errors unless said).
TOL = {
    "ggn": 1e-5,          # the GGN (dense, diagonal, last-layer block) and the Kronecker factors
    "mean": 1e-5,         # predictive mean (the network's outputs)
    "variance": 1e-4,     # predictive marginal variance (through a Cholesky / eigen solve in float32)
    "probs": 1e-6,        # probit class probabilities, max abs difference
    "ours_jit_vs_eager": 1e-5,  # our jitted programs against the eager API (variance)
    "ritz": 1e-2,         # lowrank: ||G u - λ u|| / λ_max for the top eigenpair
}
AS_CALLED_FIT = "fit, first call (torch round 1 / our first call, compile included)"
AS_CALLED_PREDICT = "predict, first call (torch round 1 / our eager first call, compile included)"
AXES = {**LAPLACE_AXES, "lowrank": {"structure": "lowrank"}}  # a case name -> laplace's two axes
TORCH_STRUCTURE = {  # ours -> laplace-torch (subset_of_weights, hessian_structure)
    "full": ("all", "full"), "diag": ("all", "diag"), "last_layer": ("last_layer", "full"),
    "kfac": ("all", "kron"), "lowrank": ("all", "lowrank"),
}


# --- laplace-torch, where installed --------------------------------------------------------


def load_torch(disabled: bool):
    """``(torch, laplace, None)``, or ``(None, None, reason)`` when not available."""
    if disabled:
        return None, None, "laplace-torch not used (--no-torch)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import laplace
            import torch
        if not hasattr(laplace, "Laplace"):
            raise ImportError(f"`laplace` at {getattr(laplace, '__file__', '?')} is not laplace-torch")
    except Exception as e:  # noqa: BLE001 - any import failure means: time ours alone
        return None, None, f"laplace-torch not installed: {type(e).__name__}: {e}"
    return torch, laplace, None


def torch_versions(torch):
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__, "torch_num_threads": torch.get_num_threads()}
    for name in ("laplace-torch", "curvlinops-for-pytorch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def torch_lowrank_unavailable():
    """laplace-torch's LowRankLaplace needs the old ``asdfghjkl`` package (a git install)."""
    from importlib.util import find_spec

    if find_spec("asdfghjkl") is None:
        return ("laplace-torch's `hessian_structure='lowrank'` (LowRankLaplace) needs the old `asdfghjkl` backend "
                "(`pip install git+https://github.com/wiseodd/asdl@asdfghjkl`), not installed; and it "
                "decomposes the Hessian, not the GGN")
    return "not compared: laplace-torch's LowRankLaplace decomposes the Hessian (AsdfghjklHessian), not the GGN"


def torch_twin(torch, model):
    """The ``eqx.nn.MLP`` as ``torch.nn.Sequential(Linear, Tanh, ..., Linear)`` with the same weights.

    Both keep ``W`` as ``(out, in)`` and order each layer's weight before its bias, so the flat
    parameter vectors (and the GGNs) have the same layout.
    """
    mods = []
    for i, layer in enumerate(model.layers):
        lin = torch.nn.Linear(layer.in_features, layer.out_features)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.array(layer.weight)))
            lin.bias.copy_(torch.from_numpy(np.array(layer.bias)))
        mods.append(lin)
        if i < len(model.layers) - 1:
            mods.append(torch.nn.Tanh())
    return torch.nn.Sequential(*mods)


def torch_fit(torch, laplace, net, loader, structure):
    subset, hessian = TORCH_STRUCTURE[structure]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        la = laplace.Laplace(net, "classification", subset_of_weights=subset, hessian_structure=hessian,
                             prior_precision=ALPHA)
        la.fit(loader)
    return la


def torch_predict(torch, la, T):
    """What ``la(T, pred_type="glm", link_approx="probit")`` computes, keeping the mean and variance."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f_mu, f_var = la._glm_predictive_distribution(T)
    var = torch.diagonal(f_var, dim1=1, dim2=2)
    kappa = 1 / torch.sqrt(1.0 + math.pi / 8 * var)
    return torch.softmax(kappa * f_mu, dim=-1), f_mu, var


def torch_ggn(la, structure):
    """The GGN laplace-torch stored: a matrix / vector, or the Kronecker factors per leaf."""
    if structure == "kfac":
        return [[np.asarray(F.detach().numpy()) for F in kf] for kf in la.H_facs.kfacs]
    return la.H.detach().numpy()


def our_ggn(post, structure):
    g = post.ggn
    if structure in ("full", "last_layer"):
        return np.asarray(g.G)
    if structure == "diag":
        return np.asarray(g.g)
    return None


def our_kfac(post, fn, params, X, y, batch_size):
    """Per leaf ``[first, second]`` of a weight, ``[B]`` of a bias: `lo.kfac`'s factors (those `pst.laplace`
    eigendecomposes), and the largest relative error of the posterior's blocks against them on a random vector."""
    K = lo.kfac(fn, params, X, y, Categorical(), batch_size=batch_size)
    blocks = [post.ggn.block(i, w) for i, w in enumerate(post.ggn.eigenvalues)]
    out = [None] * len(blocks)
    for (first, second), w, b, B in zip(K.factors, K.weight_leaves, K.bias_leaves, K.bias_blocks, strict=True):
        out[w] = [first, second]
        if b is not None:
            out[b] = [B]
    errs = []
    for block, fs in zip(blocks, out, strict=True):
        op = lo.Kronecker(*(lo.Dense(f) for f in fs)) if len(fs) == 2 else lo.Dense(fs[0])
        v = jax.random.normal(jax.random.key(2), (op.shape[1],), op.dtype)
        errs.append(H.rel_err(block @ v, op @ v))
    return [[np.asarray(f) for f in fs] for fs in out], max(errs)


def predict_fn(post, T):
    """``pst.predictive.classification(post, T)`` (probit), keeping the mean and variance."""
    mean, var = pst.predictive.linearized(post, T)
    return pst.predictive.probit(mean, var), mean, var


# --- peak resident memory ------------------------------------------------------------------


def full_118k_refusal(sizes, n_train, log):
    """``structure="full"`` on the large model: the library's refusal (before any work), or why it was not tried."""
    _, fn, params, X, y, _ = H.eqx_problem(sizes, n_train, 1)
    P = int(ravel(params)[0].shape[0])
    need = 3 * P * P * 4
    avail = lo.memory.available_bytes()
    rep = {"num_params": P, "ggn_bytes": P * P * 4, "library_estimate_bytes": need, "available_bytes": avail}
    if avail is not None and need <= avail:
        rep["result"] = "not tried: this machine reports enough memory; running it would take hours"
        return rep
    t0 = time.perf_counter()
    try:
        pst.laplace(fn, params, (jnp.asarray(X), jnp.asarray(y)), Categorical(), structure="full")
        rep["result"] = "unexpectedly ran"
    except lo.memory.MemoryBudgetError as e:
        rep["result"] = f"refused: {e}"
    rep["seconds"] = time.perf_counter() - t0
    log(f"full on P={P:,}: {rep['result'][:120]}... ({rep['seconds']:.2f} s)")
    return rep


def run_case(case, *, torch, laplace, torch_reason, peak, budget_s, log):
    name, structure, sizes = case["name"], case["structure"], case["sizes"]
    n, bs, m = case["n_train"], case["batch_size"], case["n_test"]
    model, fn, params, Xn, yn, Tn = H.eqx_problem(sizes, n, m)
    X, y, T = jnp.asarray(Xn), jnp.asarray(yn), jnp.asarray(Tn)
    P = int(ravel(params)[0].shape[0])
    kw = {**AXES[structure], "prior_precision": ALPHA, "batch_size": bs}
    if structure == "lowrank":
        kw.update(rank=case["rank"], key=jax.random.key(1))
    log(f"[{name}] {'-'.join(map(str, sizes))} tanh MLP, P={P:,}, N={n}, batch {bs}, {m} test points")
    fit_f = lambda params, X, y: pst.laplace(fn, params, (X, y), Categorical(), **kw)

    # Ours as called: the eager API's first call (compile included). Not for "full", whose first
    # call runs the same O(P^3) programs as the jitted one below, plus the compile reported there.
    first, post0 = {}, None
    if case["eager_fit"]:
        post0, first["ours fit (eager)"] = H.first_call(lambda: fit_f(params, X, y))
    # Ours compiled ahead: jax.jit of the same calls, and XLA's memory analysis of both programs.
    fit_j, first["ours fit jit: AOT compile_s"], fit_mem = H.compile_aot(fit_f, params, X, y)
    if post0 is None:
        post0 = jax.block_until_ready(fit_j(params, X, y))
    out0, first["ours predict (eager)"] = H.first_call(lambda: predict_fn(post0, T))
    P_post = int(post0.weights.indices.shape[0]) if post0.weights.indices is not None else P
    ef, pf = first.get("ours fit (eager)"), first["ours predict (eager)"]

    checks = check = H.Checks()

    # The laplace-torch side, where there is one.
    torch_case, skip_reason = None, None
    if torch is not None and structure != "lowrank":
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(0)
        net = torch_twin(torch, model)
        loader = DataLoader(TensorDataset(torch.from_numpy(Xn), torch.from_numpy(yn)), batch_size=bs)
        Tt = torch.from_numpy(Tn)
        torch_case = {"subset_of_weights": TORCH_STRUCTURE[structure][0],
                      "hessian_structure": TORCH_STRUCTURE[structure][1],
                      # FullLaplace defers its Cholesky factor to the first predictive and keeps it
                      "caches_on_first_predict": TORCH_STRUCTURE[structure][1] == "full"}
    else:
        skip_reason = torch_reason if torch is None else torch_lowrank_unavailable()

    # Fit rounds, then predictive rounds on the first round's posteriors; the libraries' order alternates.
    libs = ["ours", "torch"] if torch_case else ["ours"]
    calls = {"ours fit": lambda: fit_j(params, X, y),
             "torch fit": lambda: torch_fit(torch, laplace, net, loader, structure),
             "ours predict": lambda: pred_j(kept["ours fit"], T),
             "torch predict": lambda: torch_predict(torch, kept["torch fit"], Tt)}
    phases = {what: {f"{lib} {what}": calls[f"{lib} {what}"] for lib in libs} for what in ("fit", "predict")}
    times = {k: [] for k in (*phases["fit"], *phases["predict"])}
    rss, kept = {k: [] for k in times}, {}

    def measure(key, fn):
        """A call's seconds, and its peak RSS; the first round's outputs are kept."""
        out, t, mem = peak.call(fn, block=key.startswith("ours"))
        rss[key].append(mem)
        if not times[key]:
            kept[key] = out
        return t

    def phase(what, **kw):
        """Rounds of one phase, after those already timed; returns how many in all."""
        return H.rounds(phases[what], times={k: times[k] for k in phases[what]}, timer=measure, **kw)[1]

    # Round 1 of fit and predictive, then the agreement checks, then the other rounds. The predictive is
    # compiled for the jitted fit's posterior.
    phase("fit", max_rounds=1)
    pred_j, first["ours predict jit: AOT compile_s"], pred_mem = H.compile_aot(predict_fn, kept["ours fit"], T)
    log("  ours as called: " + (f"fit {ef['first_call_s']:.2f}s (XLA compile {H.s(ef['xla_compile_s'])}s), "
                                if ef else "fit: not timed eagerly, ")
        + f"predict {pf['first_call_s']:.2f}s (XLA compile {H.s(pf['xla_compile_s'])}s); jit compile fit "
        f"{first['ours fit jit: AOT compile_s']:.2f}s, predict {first['ours predict jit: AOT compile_s']:.2f}s")
    phase("predict", max_rounds=1)
    outs = {lib: kept.pop(f"{lib} predict") for lib in libs}
    probs0, mean0, var0 = out0
    check("ours: jitted vs eager predictive variance (rel err)", H.rel_err(outs["ours"][2], var0),
          TOL["ours_jit_vs_eager"])
    if structure == "lowrank":
        G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=bs)
        U, lam = post0.ggn.U, post0.ggn.lam
        GU = jax.jit(lambda G, U: G.mm(U))(G, U)
        res = np.asarray(jnp.linalg.norm(GU - U * lam[None, :], axis=0) / jnp.max(lam))
        check("lowrank: top eigenpair ||G u - λ u|| / λ_max", res[int(np.argmax(np.asarray(lam)))], TOL["ritz"])
        checks["lowrank: max over the k eigenpairs of ||G u - λ u|| / λ_max (info)"] = {
            "value": float(res.max()), "tol": None, "ok": None}
        checks["lowrank: ||UᵀU - I||_max (info)"] = {
            "value": float(jnp.max(jnp.abs(U.T @ U - jnp.eye(U.shape[1])))), "tol": None, "ok": None}
    if torch_case:
        la = kept["torch fit"]
        probs_t, mean_t, var_t = (o.detach().numpy() for o in outs["torch"])
        ours_g, theirs_g = our_ggn(post0, structure), torch_ggn(la, structure)
        if structure == "kfac":
            ours_g, block_err = our_kfac(post0, fn, params, X, y, bs)
            check("ours: posterior's KFAC blocks vs lo.kfac's Kronecker factors (rel err)", block_err, TOL["ggn"])
            errs = [H.rel_err(a, b) for oa, ob in zip(ours_g, theirs_g, strict=True)
                    for a, b in zip(oa, ob, strict=True)]
            check("GGN Kronecker factors, max over layers and factors (rel err)", max(errs), TOL["ggn"])
        else:
            check(f"GGN {'diagonal' if structure == 'diag' else 'matrix'} (rel err)", H.rel_err(ours_g, theirs_g),
                  TOL["ggn"])
        check("predictive mean (rel err)", H.rel_err(mean0, mean_t), TOL["mean"])
        check("predictive variance (rel err)", H.rel_err(var0, var_t), TOL["variance"])
        check("probit probabilities (max abs diff)", float(np.max(np.abs(np.asarray(probs0, np.float64) - probs_t))),
              TOL["probs"])
        if structure != "full":  # the public call on a few inputs (for "full" it costs an O(P^3) product)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pub = la(Tt[:8], pred_type="glm", link_approx="probit").detach().numpy()
            check("torch: the probit above vs la(T, pred_type='glm', link_approx='probit') (max abs diff)",
                  float(np.max(np.abs(pub - probs_t[:8]))), TOL["probs"])
        del la
    del outs
    log("  checks: " + "; ".join(f"{k} = {v['value']:.1e}" for k, v in checks.items()))
    if check.failed:
        raise SystemExit(f"[{name}] ours and laplace-torch disagree: " + "; ".join(check.failed))

    # Then more rounds while they fit in about budget_s (at least min_*_rounds in all, at most max_rounds).
    fit_rounds = phase("fit", min_rounds=case["min_fit_rounds"], max_rounds=case["max_rounds"], budget_s=budget_s)
    pred_rounds = phase("predict", min_rounds=case["min_predict_rounds"], max_rounds=case["max_rounds"],
                        budget_s=budget_s)
    kept.clear()
    post0 = out0 = None  # free them before the next case

    # laplace-torch's first predictive after a fit also computes what FullLaplace defers (its Cholesky
    # factor): the steady-state predictive ratio leaves that round out where there is a later one.
    skip = 1 if torch_case and torch_case["caches_on_first_predict"] and pred_rounds > 1 else 0
    steady_pred = {k: v[skip:] for k, v in times.items() if k.endswith("predict")}
    med = H.medians(times) | H.medians(steady_pred)
    ratios, goals = {}, {}
    if torch_case:
        same = lambda x: dict.fromkeys(("median", "p25", "p75"), x)  # a single ratio in the shape of H.ratio's
        ratios["fit"] = H.ratio(times, "torch fit", "ours fit")
        ratios["predict"] = H.ratio(steady_pred, "torch predict", "ours predict")
        if skip:
            ratios["predict, torch's first after a fit (round 1)"] = same(
                times["torch predict"][0] / times["ours predict"][0])
        ratios["fit + predict (medians)"] = same((med["torch fit"] + med["torch predict"])
                                                 / (med["ours fit"] + med["ours predict"]))
        ours_first_fit = ef["first_call_s"] if ef else first["ours fit jit: AOT compile_s"] + times["ours fit"][0]
        ratios[AS_CALLED_FIT] = same(times["torch fit"][0] / ours_first_fit)
        ratios[AS_CALLED_PREDICT] = same(times["torch predict"][0] / pf["first_call_s"])
        goals = {k: {"ratio": ratios[k]["median"], "min": g, "met": ratios[k]["median"] >= g}
                 for k, g in (("fit", GOAL_FIT), ("predict", GOAL_PREDICT))}
    log(f"  {fit_rounds} fit / {pred_rounds} predict rounds; median s: "
        + "  ".join(f"{k}={v:.3f}" for k, v in med.items())
        + ("  torch/ours: " + "  ".join(f"{k}={ratios[k]['median']:.2f}" for k in ("fit", "predict"))
           if torch_case else ""))
    return {
        "name": name, "structure": structure,
        "model": {"sizes": sizes, "activation": "tanh", "num_params": P, "num_params_posterior": P_post,
                  "dtype": "float32"},
        "n_train": n, "batch_size": bs, "n_test": m, "rank": case.get("rank"),
        "fit_rounds": fit_rounds, "predict_rounds": pred_rounds, "torch_first_predict_left_out": bool(skip),
        "torch": torch_case, "torch_skip_reason": skip_reason, "first_call": first,
        "times_s": times, "median_s": med, "min_s": H.minimums(times), "ratios": ratios, "goals": goals,
        "xla_memory": {"fit": fit_mem, "predict": pred_mem}, "rss_peak_bytes": rss,
        "rss_peak_bytes_max": {k: (None if any(x is None for x in v) else max(v)) for k, v in rss.items()},
        "checks": dict(checks),
    }


def _t(s):
    return "–" if s is None else (f"{s:.3f}" if s < 10 else f"{s:.1f}")


def _mb(b):
    return "–" if b is None else f"{b / 1e6:,.0f}"


def _x(r):
    return f"{r['median']:.2f}" + (f" ({r['p25']:.2f}–{r['p75']:.2f})" if r["p25"] != r["p75"] else "")


def _xla(d):
    return d["error"] if "error" in d else f"{_mb(d['temp_plus_output'])} ({_mb(d['argument_size_in_bytes'])})"


def _time_row(c):
    mdl, med, g = c["model"], c["median_s"], c["goals"]
    pdesc = f"{'-'.join(map(str, mdl['sizes']))} ({mdl['num_params']:,}" + (
        f"; {mdl['num_params_posterior']:,} in the posterior)" if mdl["num_params_posterior"] != mdl["num_params"]
        else ")")
    if c["torch"]:
        tpred = _t(med["torch predict"]) + (f" (first after a fit: {_t(c['times_s']['torch predict'][0])})"
                                            if c["torch_first_predict_left_out"] else "")
        cols = (_t(med["torch fit"]), _x(c["ratios"]["fit"]), H.yes(g["fit"]["met"]), _t(med["ours predict"]), tpred,
                _x(c["ratios"]["predict"]), H.yes(g["predict"]["met"]),
                f"{c['ratios']['fit + predict (medians)']['median']:.2f}")
    else:
        cols = ("–", "–", "–", _t(med["ours predict"]), "–", "–", "–", "–")
    return (c["name"], pdesc, f"{c['n_train']:,} / {c['batch_size']}", _t(med["ours fit"]), *cols,
            f"{c['fit_rounds']} / {c['predict_rounds']}")


def _first_row(c):
    f = c["first_call"]
    ff, pf = f.get("ours fit (eager)"), f["ours predict (eager)"]
    fit_first = (f"{_t(ff['first_call_s'])} ({_t(ff['xla_compile_s'])})" if ff else
                 f"{_t(f['ours fit jit: AOT compile_s'] + c['times_s']['ours fit'][0])} (jit compile + round 1)")
    tcols = ((_t(c["times_s"]["torch fit"][0]), _t(c["times_s"]["torch predict"][0]),
              f"{c['ratios'][AS_CALLED_FIT]['median']:.2f}", f"{c['ratios'][AS_CALLED_PREDICT]['median']:.2f}")
             if c["torch"] else ("–",) * 4)
    return (c["name"], fit_first, f"{_t(pf['first_call_s'])} ({_t(pf['xla_compile_s'])})",
            f"{_t(f['ours fit jit: AOT compile_s'])} / {_t(f['ours predict jit: AOT compile_s'])}", *tcols)


def markdown(report) -> str:
    cases, cfg, tv = report["result"]["cases"], report["config"], report["torch"]
    lines = H.head("Laplace posteriors vs laplace-torch", report) + [
        "Models: tanh MLPs (`eqx.nn.MLP`, float32, weights at initialisation), random standard-normal "
        "784-feature inputs, random labels in [0, 10), categorical likelihood, prior precision 1, "
        f"{cfg['n_test']} test points. laplace-torch gets the same weights (`torch.nn.Sequential`) and the same "
        "data in a `DataLoader` with the same batch size as ours.  ",
        f"laplace-torch {tv['versions'].get('laplace-torch')} (torch {tv['versions'].get('torch')}, curvlinops "
        f"{tv['versions'].get('curvlinops-for-pytorch')}, {tv['versions'].get('torch_num_threads')} threads, CPU).  "
        if tv["available"] else f"**{tv['reason']}**: our structures are timed alone.  ",
    ]
    compared = [c for c in cases if c["goals"]]
    if compared:
        ok = {k: [c["name"] for c in compared if c["goals"][k]["met"]] for k in ("fit", "predict")}
        lines.append(f"**Goals (median per-round torch/ours): fit ≥ {GOAL_FIT:g}× met in {len(ok['fit'])} of "
                     f"{len(compared)} cases ({', '.join(ok['fit']) or 'none'}); predict ≥ {GOAL_PREDICT:g}× met in "
                     f"{len(ok['predict'])} of {len(compared)} ({', '.join(ok['predict']) or 'none'}).**")
    lines += [
        *H.section("Time (steady state; seconds, median over the rounds)"),
        "Ours: `jax.jit` of the same calls, compiled ahead (compile below). laplace-torch: every call as it runs; "
        "a new `Laplace` object is fitted in every fit round. Fit rounds, then predictive rounds (on the first "
        "round's posteriors), alternate the two libraries' order; ratios are the median (and range) of the "
        f"per-round `torch / ours`. At least {cfg['cases'][1]['min_fit_rounds']} rounds of each (one fit round "
        f"for full), more while they fit in about {cfg['budget_s']:g} s per phase. laplace-torch's `\"full\"` "
        "structures (full, last_layer) compute their Cholesky factor in the first predictive after a fit and "
        "keep it: that round is shown apart and left out of the predictive ratio.",
        *H.table(("case", "model (P)", "N / batch", "ours fit", "torch fit", "fit ×", "goal ≥ 3", "ours predict",
                  "torch predict", "predict ×", "goal ≥ 10", "fit + predict ×", "rounds fit / predict"),
                 [_time_row(c) for c in cases], "lllrrrcrrrcrr"),
    ]
    if tv["available"]:
        lines += [f"\n{c['name']}: no laplace-torch counterpart timed: {c['torch_skip_reason']}."
                  for c in cases if not c["torch"]]
    fr = report["result"]["full_118k"]
    lines += [
        "",
        f"`structure=\"full\"` on the {fr['num_params']:,}-parameter model is not run: its GGN alone is "
        f"{fr['ggn_bytes'] / 1e9:.0f} GB in float32 (laplace-torch would build it the same way, as the GGN times "
        f"`torch.eye(P)`). The library: {fr['result']}",
        *H.section("First call (ours: compile included)"),
        "Ours *as called*: the eager `pst.laplace(...)` and predictive, the first time in the process (wall "
        "seconds; of which XLA compile as `jax.monitoring` records it). For full the eager fit is not timed (it "
        "runs the same O(P³) programs as the jitted one): its first call is the jit compile plus the first fit "
        "round. *jit compile*: lowering and compiling the jitted versions ahead (no run). laplace-torch has no "
        "compile: its first round is its first call.",
        *H.table(("case", "ours fit, first call (XLA compile)", "ours predict, first call (XLA compile)",
                  "jit compile fit / predict", "torch fit, round 1", "torch predict, round 1", "fit × first call",
                  "predict × first call"), [_first_row(c) for c in cases]),
        *H.section("Memory (MB = 10⁶ bytes)"),
        "*XLA*: the memory analysis of our compiled program (temp + output; arguments apart), what XLA reserves to "
        "run it. *Peak RSS*: the process's peak resident memory during the call above its resident memory just "
        "before (max over the rounds; `VmHWM` reset through `/proc/self/clear_refs`), the same measure for both "
        "libraries; it includes allocator and library overheads and is not comparable across machines.",
        *H.table(("case", "ours fit: XLA temp + output (args)", "ours fit: peak RSS", "torch fit: peak RSS",
                  "ours predict: XLA temp + output (args)", "ours predict: peak RSS", "torch predict: peak RSS"),
                 [(c["name"], _xla(c["xla_memory"]["fit"]), *(_mb(c["rss_peak_bytes_max"].get(k)) for k in (
                     "ours fit", "torch fit")), _xla(c["xla_memory"]["predict"]),
                   *(_mb(c["rss_peak_bytes_max"].get(k)) for k in ("ours predict", "torch predict"))) for c in cases]),
        *H.section("Agreement (checked on the first round, before the others)"),
        "Both libraries in float32 on the same weights and data; relative errors are Frobenius norms of the "
        "difference over the norm of laplace-torch's value. (`tests/posteriors/test_laplace_torch_parity.py` "
        "checks the same quantities in float64 to 1e-10 on a small MLP.)",
        *H.table(("case", "check", "value", "tolerance", "ok"),
                 [(c["name"], k, f"{v['value']:.2e}", "–" if v["tol"] is None else f"{v['tol']:.0e}",
                   "–" if v["ok"] is None else H.yes(v["ok"])) for c in cases for k, v in c["checks"].items()],
                 "llrrc"),
        *H.section("What this shows"),
        *reading(report),
    ]
    return H.render(lines + H.machine(report))


def reading(report):
    """A short reading of the numbers (generated from them, plus where the time goes)."""
    cases = {c["name"]: c for c in report["result"]["cases"]}
    out = []
    if report["quick"]:
        out.append("Smoke run (`--quick`, small models): the numbers are not meant to be read.")
        return out
    if not report["torch"]["available"]:
        out.append("laplace-torch is not installed here, so there is no comparison: the tables give our times and "
                   "memory alone.")
    for name, c in cases.items():
        if not c["goals"]:
            continue
        r = c["ratios"]
        out.append(f"- **{name}**: fit {r['fit']['median']:.2f}× (goal {GOAL_FIT:g}×: "
                   f"{'met' if c['goals']['fit']['met'] else 'not met'}), predictive {r['predict']['median']:.2f}× "
                   f"(goal {GOAL_PREDICT:g}×: {'met' if c['goals']['predict']['met'] else 'not met'}), "
                   f"fit + predictive {r['fit + predict (medians)']['median']:.2f}× faster than laplace-torch.")
    eager = []
    for name, c in cases.items():
        pf = c["first_call"]["ours predict (eager)"]
        run = pf["first_call_s"] - (pf["xla_compile_s"] or 0.0)
        eager.append(f"{name} {run / c['median_s']['ours predict']:.1f}×")
    out += ["", "- Our predictive called eagerly (one call: its first, less its XLA compile time) against the same "
            "function under `jax.jit` (the median): " + ", ".join(eager) + ". The chunked row values run as one "
            "compiled program either way; the KFAC predictive traces the network again on every eager call "
            "(to find its layers), which is most of its eager time (compiling once per structure is issue 20)."]
    jac = []
    for name, c in cases.items():
        xm = c["xla_memory"]["predict"]
        if "error" in xm:
            continue
        J = c["n_test"] * c["model"]["sizes"][-1] * c["model"]["num_params_posterior"] * 4
        jac.append(f"{name} {xm['temp_plus_output'] / 1e6:,.0f} MB = {xm['temp_plus_output'] / J:.1f}×")
    if jac:
        out.append("- Memory of our jitted predictive (XLA temp + output), and its ratio to one copy of the test "
                   "Jacobian (M·O × P float32): " + "; ".join(jac) + ". The rows are taken in chunks of inputs "
                   "(at most 2²⁵ numbers each, a `lax.map`), so only one chunk is live; KFAC forms no rows; full "
                   "holds L⁻¹Jᵀ of one chunk and the P × P factor.")
    m = report["machine"]
    out += ["", "Where the time goes:", ""] + NOTES + [
        "",
        "The machine is shared (load average at start / end: "
        f"{m.get('load average at start (1/5/15 min)')} and {m.get('load average at end (1/5/15 min)')}): with "
        "other jobs running, the times of calls under a second (kfac's fit, last_layer) move by several × between "
        "runs for both libraries; the per-round ratios of the calls that take seconds are the numbers to read."]
    return out


NOTES = [
    "- *full* (P = 9,706): both libraries do O(P³) dense work. Ours forms the GGN from the N·O rows of the "
    "Hessian-factor Jacobians (2·N·O·P² flops, one matrix product), then the Cholesky factor of the precision "
    "(P³/3; no covariance is formed). laplace-torch's curvlinops backend multiplies the GGN into "
    "`torch.eye(P)` by Jacobian-vector and vector-Jacobian products (about 4·N·P² flops, O/2 = 5 times fewer "
    "than the rows' product for O = 10 classes) and defers its Cholesky factor to the first predictive. Its every "
    "predictive then recomputes `scale @ scale.T` (2P³) before `J Σ Jᵀ` (2·M·O·P²); ours solves L⁻¹Jᵀ "
    "(M·O·P² flops) and sums squares.",
    "- *diag*: our exact diagonal comes from the N·O reverse passes of the Hessian-factor rows, squared and "
    "summed per batch; laplace-torch materialises each batch's Jacobian (B·O × P) with `torch.func.jacrev`. "
    "laplace-torch's predictive materialises the test Jacobian (M·O × P) with `jacrev`; ours takes its rows by "
    "reverse passes in chunks of inputs of at most 2²⁵ numbers (`lax.map`), never the whole Jacobian.",
    "- *last_layer* (1,290 parameters): laplace-torch's Jacobians of the last layer are written in closed form "
    "from the features (φ ⊗ I); ours differentiates the network with the other layers closed over. Both then do "
    "the same small dense algebra.",
    "- *kfac*: the fit is one pass for the factors and a few `eigh` (784 × 784 the largest) in both libraries. "
    "laplace-torch's predictive applies each layer's eigenbases to the M·O = 2,560 Jacobian rows (dense "
    "products, about 10¹² flops for the first layer); ours never forms a Jacobian row: a layer's block of "
    "`J Σ Jᵀ` is a Kronecker quadratic form of the layer's input activations and its output gradients (one "
    "forward pass, O reverse passes from the layer outputs), hence the large ratio.",
    "- *lowrank*: 2k + 10 = 50 Lanczos steps of GGN-vector products for k = 20; the predictive again materialises "
    "the test Jacobian's rows, in the same bounded chunks as diag (the covariance's isotropic part, 1/α outside "
    "span U, needs every row's norm).",
]


def config_for(quick: bool, min_rounds: int | None, budget_s: float | None):
    if quick:
        small, tiny, n, bs, m, rank = [64, 32, 32, 10], [32, 8, 8, 10], 128, 64, 32, 5
        budget, max_rounds = 0.5, 3
    else:
        small, tiny, n, bs, m, rank = [784, 128, 128, 10], [784, 12, 12, 10], 1024, 128, 256, 20
        budget, max_rounds = 20.0, 10
    common = {"n_train": n, "batch_size": bs, "n_test": m, "max_rounds": max_rounds, "eager_fit": True,
              "min_fit_rounds": 2, "min_predict_rounds": 2}
    cases = [
        # full: one fit round (each takes about a minute on 2 cores) and no eager fit (the same programs);
        # two predictive rounds, as laplace-torch's first predictive after a fit also factorises.
        dict(common, name="full", structure="full", sizes=tiny, batch_size=2 * bs, eager_fit=quick,
             min_fit_rounds=1),
        dict(common, name="diag", structure="diag", sizes=small),
        dict(common, name="last_layer", structure="last_layer", sizes=small),
        dict(common, name="kfac", structure="kfac", sizes=small),
        dict(common, name="lowrank", structure="lowrank", sizes=small, rank=rank),
    ]
    if min_rounds:
        for c in cases:
            c["min_fit_rounds"] = c["min_predict_rounds"] = min_rounds
            c["max_rounds"] = max(c["max_rounds"], min_rounds)
    return {"cases": cases, "n_test": m, "budget_s": budget if budget_s is None else budget_s,
            "large_sizes": [784, 128, 128, 10], "large_n": 64 if quick else n}


def main(argv=None):
    run = H.Run(__file__, __doc__, argv,
                no_torch=(bool, "time ours alone, as if laplace-torch were not installed"),
                rounds=(int, "at least this many steady-state rounds of each phase (default: 2; 1 for full's fit)"),
                budget=(float, "seconds of further rounds per phase and case (default 20; 0.5 with --quick)"),
                cases=(str, "comma-separated subset of: full,diag,last_layer,kfac,lowrank"))
    a = run.args
    cfg = config_for(run.quick, a.rounds, a.budget)
    if a.cases:
        cfg["cases"] = [c for c in cfg["cases"] if c["name"] in set(a.cases.split(","))]
    torch, laplace, reason = load_torch(a.no_torch)
    tinfo = {"available": torch is not None, "reason": reason,
             "versions": torch_versions(torch) if torch is not None else None}
    run.log(f"laplace-torch: {tinfo['versions'] if torch is not None else reason}")
    peak = procs.PeakRSS()
    if not peak.ok:
        run.log("peak RSS: /proc/self/clear_refs not available, memory per call not measured")
    cases = [run_case(c, torch=torch, laplace=laplace, torch_reason=reason, peak=peak, budget_s=cfg["budget_s"],
                      log=run.log) for c in cfg["cases"]]
    full_118k = full_118k_refusal(cfg["large_sizes"], cfg["large_n"], run.log)
    summary = {c["name"]: ({k: c["ratios"][k]["median"] for k in ("fit", "predict", "fit + predict (medians)")}
                           | {f"{k}_goal_met": c["goals"][k]["met"] for k in ("fit", "predict")}
                           if c["goals"] else {"ours fit s": c["median_s"]["ours fit"],
                                               "ours predict s": c["median_s"]["ours predict"],
                                               "torch": c["torch_skip_reason"]}) for c in cases}
    run.write({"goals": {"fit": {"ratio": "laplace-torch fit time / ours (median per round)", "min": GOAL_FIT},
                         "predict": {"ratio": "laplace-torch predictive time / ours (median per round)",
                                     "min": GOAL_PREDICT}},
               "tolerances": TOL, "config": cfg, "torch": tinfo, "summary": summary,
               "result": {"cases": cases, "full_118k": full_118k}},
              markdown, machine={"peak RSS measurable": peak.ok, **(tinfo["versions"] or {})})


if __name__ == "__main__":
    main()
