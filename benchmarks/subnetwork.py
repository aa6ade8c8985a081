#!/usr/bin/env python
"""Subnetwork Laplace (``posteriors.subnetwork_laplace``): restricted derivatives vs materialise-then-slice.

The 784-128-128-10 tanh MLP of ``eqx.nn.MLP`` (118,282 float32 parameters) at its initial weights,
N = 512 random inputs, categorical likelihood, prior precision 1 rescaled to λS/P, batches of 32; subnets of
S = 100, 1,000 and 5,000 weights from ``subnetwork.random`` and ``subnetwork.largest_magnitude``. Compiled
ahead and timed in interleaved rounds: ``library`` (``jax.jit`` of ``pst.subnetwork_laplace``, the whole
posterior), ``restricted GGN`` (the S × S GGN by VJPs of ``linops.models.restrict``'s model, by hand),
``slice GGN`` (the same code on the full model: rows P wide, then the S columns, the reference),
``factor`` (Cholesky + Σ by ``cho_solve``) and ``cholesky``. The three GGNs agree (≤ 1e-5) and the
covariances (≤ 1e-3) before timing. Also: XLA's memory analysis of each program, the eager call, the
selected weights per leaf. See ``benchmarks/README.md``.

Run:  python benchmarks/subnetwork.py            # full run (about 7.5 minutes on 2 shared cores)
      python benchmarks/subnetwork.py --quick    # smoke run (a 64-32-32-10 MLP, N = 64, S = 50; ~35 s)
"""

from __future__ import annotations

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import from_equinox, ravel, restrict

TOL_GGN = 1e-5     # S × S GGN: library / restricted / slice
TOL_COV = 1e-3     # posterior covariance: library vs slice (float32 inverse of Λ)
PRIOR = 1.0        # λ; the library rescales it to λ S / P (rescale_prior=True, its default)
KINDS = ("random", "largest_magnitude")
RATIO_PAIRS = {
    "library / slice end to end": ("library", "slice end to end"),
    "restricted GGN / slice GGN": ("restricted GGN", "slice GGN"),
    "library / restricted end to end": ("library", "restricted end to end"),
    "factor / library": ("factor", "library"),
    "cholesky / library": ("cholesky", "library"),
    "factor / slice end to end": ("factor", "slice end to end"),
}
COND_MAX_S = 1000          # cond(Λ) by float64 eigenvalues only up to this S
AS_CALLED_SECOND_S = 10.0  # call the library eagerly a second time only where the first call took less


def make_problem(cfg):
    d, width, depth, out = cfg["mlp"]
    fn, params = from_equinox(eqx.nn.MLP(d, out, width, depth, activation=jax.nn.tanh, key=jax.random.key(0)))
    kx, ky = jax.random.split(jax.random.key(1))
    X = jax.random.normal(kx, (cfg["n"], d), jnp.float32)
    y = jax.random.randint(ky, (cfg["n"],), 0, out)
    return fn, params, X, y


def choose(kind, params, size):
    if kind == "random":
        return pst.subnetwork.random(jax.random.key(2), params, size)
    return pst.subnetwork.largest_magnitude(params, size)


def leaf_table(params, idx):
    """Per leaf: its name, size, and how many selected weights it holds."""
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    sizes = np.array([int(np.size(leaf)) for _, leaf in paths])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    counts = np.bincount(np.searchsorted(starts, idx, side="right") - 1, minlength=len(sizes))
    return [{"leaf": jax.tree_util.keystr(p), "size": int(s), "selected": int(c)}
            for (p, _), s, c in zip(paths, sizes, counts, strict=True)]


# --- the programs ------------------------------------------------------------------------


def ggn_rows_program(batch, lik):
    """``ggn(model, theta, X, y, cols)``: Σ_batches Rᵀ R, R the (B·K, width) rows of A_n J_n per batch.

    The rows are built as ``GGNOp.as_matrix`` builds them (one VJP per row of the likelihood's
    Hessian factor A_n, vmapped over the rows and the batch's examples); with ``cols`` they are
    P wide and sliced to the subset's columns afterwards.
    """

    def ggn(model, theta, X, y, cols=None):
        n = X.shape[0]
        Xb, yb = X.reshape((n // batch, batch) + X.shape[1:]), y.reshape(n // batch, batch)
        size = theta.shape[0] if cols is None else cols.shape[0]

        def step(acc, data):
            xb, tb = data
            out = jax.vmap(model, in_axes=(None, 0))(theta, xb)
            A = jax.vmap(lik.hessian_factor)(out, tb)                                  # (B, K, O)

            def example(x, a):
                _, vjp = jax.vjp(lambda p: model(p, x), theta)
                return jax.vmap(lambda r: ravel(vjp(r)[0])[0])(a)                     # (K, width)

            R = jax.vmap(example)(xb, A)
            R = R.reshape(-1, R.shape[-1])
            if cols is not None:
                R = R[:, cols]                                                         # materialise, then slice
            return acc + R.T @ R, None

        return lax.scan(step, jnp.zeros((size, size), X.dtype), (Xb, yb))[0]

    return ggn


def factor_fn(G, alpha):
    """As ``posteriors`` factorises a dense GGN: Cholesky of Λ = G + αI, Σ = Λ⁻¹ (symmetrised)."""
    L = jnp.linalg.cholesky(G + alpha * jnp.eye(G.shape[0], dtype=G.dtype))
    Sigma = jax.scipy.linalg.cho_solve((L, True), jnp.eye(G.shape[0], dtype=G.dtype))
    return L, (Sigma + Sigma.T) / 2


def cholesky_fn(G, alpha):
    """The Cholesky factor alone (the first half of `factor_fn`)."""
    return jnp.linalg.cholesky(G + alpha * jnp.eye(G.shape[0], dtype=G.dtype))


def compile_ahead(f, *args):
    """``jax.jit(f).lower(*args).compile()``, timed (trace / lower / XLA compile): (compiled, report)."""
    return H.first_call(lambda: jax.jit(f).lower(*args).compile())


def run_case(kind, size, prob, cfg, *, log, timing, as_called_rounds, check_batch_size):
    fn, params, X, y = prob
    lik, b = Categorical(), cfg["batch_size"]
    P = int(ravel(params)[0].shape[0])
    sub = choose(kind, params, size)
    idx_np = np.asarray(sub.indices)
    idx = jnp.asarray(idx_np)
    alpha = jnp.asarray(PRIOR * size / P, jnp.float32)
    ggn = ggn_rows_program(b, lik)
    library_f = lambda params, X, y: pst.subnetwork_laplace(fn, params, (X, y), lik, sub, PRIOR, batch_size=b)
    restricted_f = lambda params, X, y: ggn(*restrict(fn, params, idx_np), X, y)
    slice_f = lambda params, X, y, idx: ggn(fn, params, X, y, idx)

    # Compile ahead (memory analysis from the same compiled programs), one call each for the checks.
    G_shape = jax.ShapeDtypeStruct((size, size), jnp.float32)
    ahead = {"library": compile_ahead(library_f, params, X, y),
             "restricted GGN": compile_ahead(restricted_f, params, X, y),
             "slice GGN": compile_ahead(slice_f, params, X, y, idx),
             "factor": compile_ahead(lambda G, a: factor_fn(G, a), G_shape, alpha),  # new functions: compiled again
             "cholesky": compile_ahead(lambda G, a: cholesky_fn(G, a), G_shape, alpha)}
    programs, compile_rep = {k: c for k, (c, _) in ahead.items()}, {k: r for k, (_, r) in ahead.items()}
    memory = {k: H.memory(c) for k, c in programs.items()}
    calls = {"library": lambda: programs["library"](params, X, y),
             "restricted GGN": lambda: programs["restricted GGN"](params, X, y),
             "slice GGN": lambda: programs["slice GGN"](params, X, y, idx),
             "factor": lambda: programs["factor"](G_slice, alpha),
             "cholesky": lambda: programs["cholesky"](G_slice, alpha)}
    outs, first = {}, {}
    for k, c in calls.items():  # in this order: factor and cholesky take the slice GGN
        outs[k], first[k] = H.timed(c)
        G_slice = outs.get("slice GGN")
    (L_slice, Sigma_slice), L_only = outs["factor"], outs["cholesky"]

    post = outs["library"]  # it keeps the GGN and the Cholesky factor of Λ; Σ = Λ⁻¹ by its two triangular solves
    G_lib, L_lib = post.ggn.G, post.factor
    Sigma_lib = post.ggn.covariance(post.prior_precision, post.noise_scale, post.factor).as_matrix()
    cond = None
    if size <= COND_MAX_S:  # float64 eigenvalues: ~35 s at S = 5,000 on 2 loaded cores, so only up to 1,000
        eig = np.linalg.eigvalsh(np.asarray(G_slice, np.float64) + float(alpha) * np.eye(size))
        cond = float(eig[-1] / eig[0])
    checks = {
        "library prior λ_S == λ S / P": bool(np.isclose(float(post.prior_precision), float(alpha), rtol=1e-6)),
        "library posterior's subset == subnetwork indices": bool(np.array_equal(np.asarray(post.weights.indices),
                                                                                  idx_np)),
        "GGN: restricted vs slice (rel err)": H.rel_err(outs["restricted GGN"], G_slice),
        "GGN: library vs slice (rel err)": H.rel_err(G_lib, G_slice),
        "covariance: library vs slice (rel err)": H.rel_err(Sigma_lib, Sigma_slice),
        "Cholesky factor: library vs slice (rel err)": H.rel_err(L_lib, L_slice),
        "cholesky program vs factor's L (rel err)": H.rel_err(L_only, L_slice),
        f"cond(Λ) (float64 eigenvalues; S ≤ {COND_MAX_S:,} only)": cond,
    }
    ok = (checks["GGN: restricted vs slice (rel err)"] <= TOL_GGN and checks["GGN: library vs slice (rel err)"]
          <= TOL_GGN and checks["covariance: library vs slice (rel err)"] <= TOL_COV
          and checks["cholesky program vs factor's L (rel err)"] <= TOL_GGN
          and checks["library prior λ_S == λ S / P"] and checks["library posterior's subset == subnetwork indices"])
    log(f"  {kind} S={size}: checks " + "  ".join(
        f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in checks.items()))
    if not ok:
        raise SystemExit(f"{kind} S={size}: the paths disagree: {checks}")

    # Steady state, interleaved (no warm-up: compiled ahead and called once; at S = 5,000 a round takes seconds).
    times, n_rounds = H.rounds(calls, **timing)
    times["slice end to end"] = [a + c for a, c in zip(times["slice GGN"], times["factor"], strict=True)]
    times["restricted end to end"] = [a + c for a, c in zip(times["restricted GGN"], times["factor"], strict=True)]
    med = H.medians(times)
    ratios = {k: H.ratio(times, a, b) for k, (a, b) in RATIO_PAIRS.items()}
    # Ratios of the fastest calls: the other processes of a shared machine only ever add time to a call.
    min_ratios = {k: min(times[a]) / min(times[b]) for k, (a, b) in RATIO_PAIRS.items()}
    log(f"  {kind} S={size}: {n_rounds} rounds  " + "  ".join(f"{k}={v * 1e3:.1f}ms" for k, v in med.items())
        + "  " + "  ".join(f"{k}={v['median']:.3f}" for k, v in ratios.items()))

    # The public call as a user makes it: eager, every call builds new closures and compiles again.
    # A second call only where the first took under AS_CALLED_SECOND_S (it shows the compile again).
    as_called = []
    for r in range(as_called_rounds):
        if r and as_called[-1]["first_call_s"] > AS_CALLED_SECOND_S:
            break
        as_called.append(H.first_call(lambda: jax.tree_util.tree_leaves(pst.subnetwork_laplace(
            fn, params, (X, y), lik, sub, PRIOR, batch_size=b)))[1])

    # Does subnetwork_laplace's batch_size change the compiled program? (memory of another batch_size)
    batch_size_effect = None
    if check_batch_size:
        other = max(1, b // 4)
        comp, _ = compile_ahead(lambda p, X, y: pst.subnetwork_laplace(fn, p, (X, y), lik, sub, PRIOR,
                                                                       batch_size=other), params, X, y)
        batch_size_effect = {"batch_size": b, "other_batch_size": other,
                             "temp_bytes": memory["library"].get("temp_size_in_bytes"),
                             "other_temp_bytes": H.memory(comp).get("temp_size_in_bytes")}
    item, rows = 4, b * cfg["mlp"][3]
    return {
        "kind": kind, "size": size, "strategy": sub.strategy, "leaves": leaf_table(params, idx_np),
        "prior_precision_rescaled": float(alpha), "checks": checks, "compile": compile_rep, "first_call_s": first,
        "rounds": n_rounds, "median_s": med, "min_s": H.minimums(times), "times_s": times, "ratios": ratios,
        "ratios_of_minimums": min_ratios, "memory_analysis": memory,
        "bytes": {"S x S matrix": size * size * item,
                  "Subnetwork.memory_bytes (GGN, Cholesky, covariance)": int(sub.memory_bytes),
                  "slice rows per batch (B·K × P)": rows * P * item,
                  "restricted rows per batch (B·K × S)": rows * size * item},
        "as_called": as_called, "batch_size_effect": batch_size_effect,
    }


# --- report ------------------------------------------------------------------------------

SHOWN_RATIOS = list(RATIO_PAIRS)[:5]


def _mem(rep):
    return "n/a" if "error" in rep else H.mb(rep["temp_plus_output"])


def markdown(report) -> str:
    m, cases = report["model"], report["result"]["cases"]
    row = lambda c, *cells: (c["kind"], f"{c['size']:,}", *cells)
    lines = [
        "# Subnetwork Laplace: restricted derivatives vs materialise-then-slice",
        "",
        f"Generated by `{report['command']}`" + (" (**quick smoke run: numbers not meant to be read**)"
                                                 if report["quick"] else "") + f"; total {report['total_s']:.0f} s.",
        "",
        f"Model: {m['description']} ({m['num_params']:,} float32 parameters) at its initial weights, N = "
        f"{m['num_examples']} random inputs, categorical likelihood (K = O = {m['num_outputs']}), prior precision "
        f"{PRIOR:g} rescaled to λ S / P, batches of {m['batch_size']} examples. Subsets: `subnetwork.random` and "
        "`subnetwork.largest_magnitude` (which leaves they touch: below).",
        "",
        "Methods, all `jax.jit`-compiled ahead and timed in interleaved rounds (order rotated, gc off, "
        "`block_until_ready`): **library** = `pst.subnetwork_laplace(...)` (the whole posterior: the S × S GGN "
        "of `linops.models.restrict`'s model and the Cholesky factor of Λ); **restricted GGN** = the S × S GGN by "
        "VJPs of the restricted model, written by hand (per example the K rows of A_n J_n E_s, `Rᵀ R` per "
        "batch); **slice GGN** = the same code on the full model, rows P wide, then the S columns "
        "(materialise-then-slice); **factor** = Λ = G + λ_S I, Cholesky, Σ = Λ⁻¹ by `cho_solve` (`posteriors` "
        "keeps the Cholesky factor and Σ implicit); **cholesky** = its Cholesky alone. *slice end to end* = slice "
        "GGN + factor of the same round (the library's reference); *restricted end to end* = restricted GGN + factor.",
        *H.section("Time"),
        "Median ms per call (the minimum over rounds is in the JSON).",
        *H.table(("subset", "S", "rounds", "library", "slice end to end", "restricted GGN", "slice GGN", "factor",
                  "cholesky"), [row(c, c["rounds"], *(H.ms(c["median_s"][k]) for k in (
                      "library", "slice end to end", "restricted GGN", "slice GGN", "factor", "cholesky")))
                                for c in cases], "lr" + "r" * 7),
        "Median (IQR) of the per-round ratios:",
        *H.table(("subset", "S", "**library / slice end to end**", "**restricted GGN / slice GGN**",
                  *SHOWN_RATIOS[2:]), [row(c, *(H.iqr(c["ratios"][k]) for k in SHOWN_RATIOS)) for c in cases],
                 "lrrrrrr"),
        "The same ratios from each method's fastest call (min / min; the machine's other processes only ever add "
        "time to a call, so these are the less noisy estimate when it is loaded):",
        *H.table(("subset", "S", *SHOWN_RATIOS),
                 [row(c, *(f"{c['ratios_of_minimums'][k]:.3f}" for k in SHOWN_RATIOS)) for c in cases], "lrrrrrr"),
        *H.section("Memory"),
        "XLA's memory analysis of each compiled program, temp + output, MB (arguments, the params and X, "
        f"{H.mb(cases[0]['memory_analysis']['slice GGN'].get('argument_size_in_bytes'))} MB, not included). "
        "On CPU this is the program's buffer assignment, not a measured process peak.",
        *H.table(("subset", "S", "library", "restricted GGN", "slice GGN", "factor", "one S × S matrix",
                  "rows per batch: restricted / slice"),
                 [row(c, *(_mem(c["memory_analysis"][k]) for k in ("library", "restricted GGN", "slice GGN", "factor")),
                      H.mb(c["bytes"]["S x S matrix"]), f"{H.mb(c['bytes']['restricted rows per batch (B·K × S)'])} / "
                      f"{H.mb(c['bytes']['slice rows per batch (B·K × P)'])}") for c in cases], "lrrrrrrl"),
    ]
    eff = [c["batch_size_effect"] for c in cases if c["batch_size_effect"]]
    if eff:
        e = eff[0]
        lines += ["", f"`subnetwork_laplace(..., batch_size={e['batch_size']})` and "
                  f"`batch_size={e['other_batch_size']}` compile to programs with {H.mb(e['temp_bytes'])} and "
                  f"{H.mb(e['other_temp_bytes'])} MB of temp " + (
                      "(the same: `batch_size` does not reach the dense GGN)."
                      if e["temp_bytes"] == e["other_temp_bytes"]
                      else "(`GGNOp.as_matrix` builds the GGN in batches of at most `batch_size` examples).")]
    leaves = cases[0]["leaves"]
    lines += [
        *H.section("The library as called"),
        "`pst.subnetwork_laplace(...)` called eagerly, as a user calls it (every call builds new closures, so "
        "every call traces and compiles again), blocked on all of the posterior's arrays.",
        *H.table(("subset", "S", "calls: wall s", "of which XLA compile s", "compiled library (median) ms"),
                 [row(c, ", ".join(f"{a['first_call_s']:.2f}" for a in c["as_called"]),
                      ", ".join(H.s(a["xla_compile_s"]) for a in c["as_called"]), H.ms(c["median_s"]["library"]))
                  for c in cases], "lrllr"),
        *H.section("Subsets: selected weights per leaf"),
        *H.table(("subset", "S", *(f"`{r['leaf']}` ({r['size']:,})" for r in leaves)),
                 [row(c, *(f"{r['selected']:,}" for r in c["leaves"])) for c in cases]),
        *H.section("Compile (ahead of time: trace + lower + XLA compile, s)"),
        *H.table(("subset", "S", "library", "restricted GGN", "slice GGN", "factor", "cholesky"),
                 [row(c, *(f"{r['first_call_s']:.2f}" for r in c["compile"].values())) for c in cases]),
        *H.section(f"Checks (before timing; GGN tolerance {TOL_GGN:g}, covariance {TOL_COV:g}, relative "
                   "Frobenius error)"),
        *H.table(("subset", "S", *cases[0]["checks"]),
                 [row(c, *(f"{v:.1e}" if isinstance(v, float) else "not computed" if v is None else str(v)
                           for v in c["checks"].values())) for c in cases], "lr" + "l" * len(cases[0]["checks"])),
        *H.section("Reading"),
        *reading(report),
    ]
    return H.render(lines + H.machine(report))


def reading(report):
    """A short reading of the tables, with the numbers of this run."""
    cases = {(c["kind"], c["size"]): c for c in report["result"]["cases"]}
    sizes = report["config"]["sizes"]
    s0, s1, s2 = sizes[0], sizes[len(sizes) // 2], sizes[-1]
    rnd, mag = "random", "largest_magnitude"

    def r(kind, s, name):
        return cases[(kind, s)]["ratios"][name]["median"]

    def med(kind, s, name):
        return cases[(kind, s)]["median_s"][name]

    def mem(kind, s, name):
        return cases[(kind, s)]["memory_analysis"][name].get("temp_plus_output")

    def both(s, name, fmt=".3f"):
        return f"{r(rnd, s, name):{fmt}} / {r(mag, s, name):{fmt}}"

    def both_min(s, name):
        m = [cases[(k, s)]["ratios_of_minimums"][name] for k in KINDS]
        return f"{m[0]:.2f} / {m[1]:.2f}"

    small = [s for s in sizes if s <= s1]
    slice_small = [med(k, s, "slice GGN") for k in KINDS for s in small]
    first_calls = [a["first_call_s"] for c in report["result"]["cases"] for a in c["as_called"]]
    rows = cases[(rnd, s0)]["bytes"]
    first_leaf = cases[(rnd, s0)]["leaves"][0]["size"]
    lib_ms = [med(k, s0, "library") for k in KINDS]
    n, k_out = report["model"]["num_examples"], report["model"]["num_outputs"]
    chunk = min(n, (1 << 25) // (k_out * s2))
    squares = cases[(rnd, s2)]["bytes"]["Subnetwork.memory_bytes (GGN, Cholesky, covariance)"]
    return [
        "Pairs of numbers are random / largest-magnitude subset.",
        "",
        f"- **Small subnets: the restricted path wins by the width of the rows.** At S = {s0:,} the restricted "
        f"GGN takes {both(s0, 'restricted GGN / slice GGN')}× the slice path's time, and the library end to end "
        f"{both(s0, 'library / slice end to end')}× the slice path's (at S = {s1:,}: "
        f"{both(s1, 'restricted GGN / slice GGN', '.2f')}× and {both(s1, 'library / slice end to end', '.2f')}×). "
        f"Up to S = {s1:,} the slice GGN takes {H.ms(min(slice_small))}-{H.ms(max(slice_small))} ms whatever the "
        f"subset: it is the cost of writing B·K rows P wide per batch ({H.mb(rows['slice rows per batch (B·K × P)'])} "
        f"MB, against {H.mb(rows['restricted rows per batch (B·K × S)'])} MB restricted), and its temp memory "
        f"({H.mb(mem(rnd, s0, 'slice GGN'))} MB) does not depend on S.",
        f"- **Where the subset lies matters to the restricted path only.** A random subset holds first-layer "
        f"weights, so its restricted reverse pass runs back to the input layer; XLA still computes only the "
        f"selected entries of that layer's gradient `x ⊗ δ` (the restricted program's temp + output is "
        f"{H.mb(mem(rnd, s0, 'restricted GGN'))} MB at S = {s0:,}: the {first_leaf:,}-entry block is never formed). "
        "The "
        f"largest-magnitude subset has no first-layer weight here and stops a layer earlier: restricted GGN "
        f"{H.ms(med(rnd, s0, 'restricted GGN'))} vs {H.ms(med(mag, s0, 'restricted GGN'))} ms at S = {s0:,}, "
        f"{H.ms(med(rnd, s1, 'restricted GGN'))} vs {H.ms(med(mag, s1, 'restricted GGN'))} ms at S = {s1:,}. "
        "Both are far below the slice path, which pays for every leaf whichever are selected.",
        f"- **At S = {s2:,} the S × S algebra dominates and the two paths converge.** Rᵀ R is 2·N·K·S² flops "
        f"on either path, and the factorisation (Cholesky, S³/3 flops, then Σ by `cho_solve` on the identity, "
        f"2 S³) takes {both_min(s2, 'factor / library')} of the library's time, the Cholesky alone "
        f"{both_min(s2, 'cholesky / library')} (at S = {s1:,}: {both_min(s1, 'factor / library')} and "
        f"{both_min(s1, 'cholesky / library')}; from the fastest calls, less sensitive to the machine's other "
        "load than the per-round ratios). Library / slice end to end = "
        f"{both(s2, 'library / slice end to end', '.2f')}, restricted / slice GGN = "
        f"{both(s2, 'restricted GGN / slice GGN', '.2f')}.",
        f"- **Memory.** Restricted GGN {H.mb(mem(rnd, s0, 'restricted GGN'))} / {H.mb(mem(rnd, s1, 'restricted GGN'))}"
        f" / {H.mb(mem(rnd, s2, 'restricted GGN'))} MB (temp + output, random subset, S = {s0:,} / {s1:,} / "
        f"{s2:,}); slice GGN {H.mb(mem(rnd, s0, 'slice GGN'))} / {H.mb(mem(rnd, s1, 'slice GGN'))} / "
        f"{H.mb(mem(rnd, s2, 'slice GGN'))} MB. The library's whole program needs {H.mb(mem(rnd, s0, 'library'))} / "
        f"{H.mb(mem(rnd, s1, 'library'))} / {H.mb(mem(rnd, s2, 'library'))} MB: it keeps two S × S matrices (the "
        f"GGN and the Cholesky factor; three at its peak, with Λ: {H.mb(squares)} MB at S = {s2:,}) and builds the "
        f"GGN in batches of at most `batch_size` examples and about 2²⁵ row entries (min(batch_size, 2²⁵ / (K S)); "
        f"{chunk} examples without a batch size at S = {s2:,}). At large S the S × S arrays, not the Jacobian rows, "
        "set the memory of either path.",
        f"- **As called**, eagerly, `subnetwork_laplace` traces and compiles again on every call (new closures): "
        f"{min(first_calls):.1f}-{max(first_calls):.1f} s per call here, most of it compilation at small S, "
        f"where the compiled program takes {H.ms(min(lib_ms))}-{H.ms(max(lib_ms))} ms.",
        "",
        "The machine was shared (load averages in the *Machine* table): medians of single methods move between "
        "runs; compare the ratios (per-round, or of the fastest calls), not single medians.",
    ]


def config_for(quick: bool):
    if quick:  # smoke run: a small MLP; its numbers are not meant to be read
        return {"mlp": [64, 32, 2, 10], "n": 64, "batch_size": 16, "sizes": [50],
                "timing": {"min_rounds": 2, "max_rounds": 5, "budget_s": 0.3}, "as_called_rounds": 1}
    return {"mlp": [784, 128, 2, 10], "n": 512, "batch_size": 32, "sizes": [100, 1000, 5000],
            "timing": {"min_rounds": 3, "max_rounds": 40, "budget_s": 15.0}, "as_called_rounds": 2}


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    cfg = config_for(run.quick)
    prob = make_problem(cfg)
    P = int(ravel(prob[1])[0].shape[0])
    d, width, depth, out = cfg["mlp"]
    desc = f"{d}-" + "-".join([str(width)] * depth) + f"-{out} tanh MLP (`eqx.nn.MLP`)"
    run.log(f"model {desc}, P={P:,}, N={cfg['n']}, batch {cfg['batch_size']}, S in {cfg['sizes']}")
    cases = [run_case(kind, size, prob, cfg, log=run.log, timing=cfg["timing"],
                      as_called_rounds=cfg["as_called_rounds"],
                      check_batch_size=(kind == "random" and i == len(cfg["sizes"]) // 2))
             for kind in KINDS for i, size in enumerate(cfg["sizes"])]
    run.write({
        "config": cfg, "tolerances": {"ggn_rel_err": TOL_GGN, "covariance_rel_err": TOL_COV},
        "model": {"description": desc, "num_params": P, "num_examples": cfg["n"], "num_outputs": out,
                  "batch_size": cfg["batch_size"], "likelihood": "Categorical", "prior_precision": PRIOR,
                  "rescale_prior": True, "dtype": "float32"},
        "summary": {f"{c['kind']} S={c['size']}": {
            "median per-round ratios": {k: v["median"] for k, v in c["ratios"].items()},
            "ratios of minimums": c["ratios_of_minimums"]} for c in cases},
        "result": {"cases": cases}}, markdown)


if __name__ == "__main__":
    main()
