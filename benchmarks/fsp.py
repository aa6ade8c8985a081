#!/usr/bin/env python
"""FSP-Laplace and its building blocks: kernel Gram products, Lanczos, algorithm 2 step by step.

Three measurements, each in one process with its methods interleaved (float32), every program compiled
ahead: (a) ``lo.KernelGramOp`` products against a dense Gram matvec (formed in the product, or
precomputed) and a hand-tiled reference, n = 1,000 / 10,000 / 50,000, with XLA's memory analysis (a dense
route runs only where ``lo.memory.check_fits`` accepts it); (b) ``lo.lanczos`` against matfree's
``tridiag_sym``, forward and reverse, same Ritz values and gradients checked first; (c) FSP-Laplace end to
end on the paper's 1-D regression and two moons: GP fit, training, and ``fsp_laplace`` taken apart into its
steps, checked to give its posterior. See ``benchmarks/README.md``.

Run:  python benchmarks/fsp.py            # full run (about 6 minutes on 2 cores)
      python benchmarks/fsp.py --quick    # smoke run (under a minute; small sizes, few steps)
      python benchmarks/fsp.py --dense-limit-gb 12   # let the dense Gram routes use more memory
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import math
import statistics
import time

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import linops as lo
import posteriors as pst
from linops.kernels import RBF, Matern52, fit_gp
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel

DTYPE = jnp.float32
RTOL_FSP = 1e-6  # fsp_laplace's default relative cut-off
REF_DENSE_LANCZOS = "reference: the same Lanczos on K_CC formed densely (`lo.Dense(k(C))`)"
GRAM_METHODS = ("tiled", "hand-tiled", "dense (form + matvec)", "dense (precomputed)")


# --- (a) KernelGramOp products vs a dense Gram matvec ------------------------------------
KERNELS = {"RBF": lambda: RBF(0.5, 1.0), "Matern52": lambda: Matern52(0.5, 1.0)}


def hand_tiled(name, block_size):
    """The Gram product written by hand: ``lax.map`` over the operator's row blocks, the
    squared distance summed per input dimension (no reduction over a length-d axis)."""

    def apply(ell, var, X, v):
        n, d = X.shape
        count = -(-n // block_size)
        idx = np.minimum(np.arange(count * block_size), n - 1).reshape(count, block_size)

        def block(Xb):
            r2 = sum(((Xb[:, None, i] - X[None, :, i]) / ell) ** 2 for i in range(d))
            if name == "RBF":
                k = var * jnp.exp(-0.5 * r2)
            else:
                s = math.sqrt(5.0) * jnp.sqrt(r2)
                k = var * (1 + s + s**2 / 3) * jnp.exp(-s)
            return k @ v

        return lax.map(block, X[idx]).reshape(-1)[:n]

    return apply


def gram_case(kname, n, *, dense_limit, budget_s, min_rounds, log):
    kernel = KERNELS[kname]()
    kx, kv = jax.random.split(jax.random.key(n))
    X = jax.random.normal(kx, (n, 2), DTYPE)
    v = jax.random.normal(kv, (n,), DTYPE)
    K = lo.KernelGramOp(kernel, X)
    gram_bytes = n * n * np.dtype(DTYPE).itemsize
    X_s, v_s = jax.ShapeDtypeStruct(X.shape, DTYPE), jax.ShapeDtypeStruct(v.shape, DTYPE)
    G_s = jax.ShapeDtypeStruct((n, n), DTYPE)

    # Compile everything first (no run): the dense routes' needs come from their programs.
    progs = {
        "tiled": H.compile_aot(lambda K, v: K @ v, K, v_s),
        "hand-tiled": H.compile_aot(hand_tiled(kname, K.block_size), kernel.lengthscale, kernel.variance, X_s, v_s),
        "dense (form + matvec)": H.compile_aot(lambda k, X, v: k(X) @ v, kernel, X_s, v_s),
        "dense (precomputed)": H.compile_aot(lambda G, v: G @ v, G_s, v_s),
    }
    form = H.compile_aot(lambda k, X: k(X), kernel, X_s)
    mem = {m: p[2] for m, p in progs.items()}
    compile_s = {m: p[1] for m, p in progs.items()}
    # The precomputed route holds the Gram (an argument) and first forms it (a program whose output it is).
    needs = {"dense (form + matvec)": mem["dense (form + matvec)"]["total"],
             "dense (precomputed)": max(mem["dense (precomputed)"]["total"], form[2]["total"])}
    status = {"tiled": "run", "hand-tiled": "run"}
    for m, need in needs.items():
        try:
            lo.memory.check_fits(need, f"{m} at n={n}", "use lo.KernelGramOp", limit=dense_limit)
            status[m] = "run"
        except lo.memory.MemoryBudgetError as e:
            status[m] = f"not run: {e}"
    running = [m for m in progs if status[m] == "run"]

    args = {
        "tiled": (K, v),
        "hand-tiled": (kernel.lengthscale, kernel.variance, X, v),
        "dense (form + matvec)": (kernel, X, v),
    }
    form_s = None
    if "dense (precomputed)" in running:
        G, form_s = H.timed(lambda: form[0](kernel, X))
        args["dense (precomputed)"] = (G, v)
    first, outs = {}, {}
    for m in running:
        outs[m], first[m] = H.timed(lambda m=m: progs[m][0](*args[m]))
    checks = {f"{m} vs tiled (rel err)": H.rel_err(outs[m], outs["tiled"]) for m in running if m != "tiled"}
    # Rows of the dense Gram (small) against the tiled product's first rows, at every size.
    rows = min(n, 256)
    head = jax.jit(lambda k, A, B, v: k(A, B) @ v)(kernel, X[:rows], X, v)
    checks["first rows of k(X[:256], X) @ v vs tiled (rel err)"] = H.rel_err(outs["tiled"][:rows], head)
    for what, err in checks.items():
        assert err <= 1e-4, f"check failed ({kname}, n={n}): {what} = {err:.2e}"

    calls = {m: (lambda m=m: progs[m][0](*args[m])) for m in running}
    times, n_rounds = H.rounds(calls, budget_s=budget_s, min_rounds=min_rounds, max_rounds=50)
    med = H.medians(times)
    ratios = {f"{m}/tiled": H.ratio(times, m, "tiled") for m in running}
    if "dense (precomputed)" in running:
        del args["dense (precomputed)"], G
    log(f"  {kname} n={n}: rounds={n_rounds} " + "  ".join(f"{m}={med[m]:.4f}s" for m in running)
        + "  " + "  ".join(f"{m}: {s[:60]}" for m, s in status.items() if s != "run"))
    return {
        "kernel": kname, "n": n, "d": 2, "block_size": K.block_size, "dense_gram_bytes": gram_bytes,
        "status": status, "dense_bytes_needed": needs, "rounds": n_rounds, "median_s": med,
        "min_s": H.minimums(times), "first_run_s": first, "compile_s": compile_s,
        "form_gram_s": form_s, "ratios": ratios, "memory_analysis": mem, "form_gram_memory": form[2],
        "checks": checks,
    }


# --- (b) Lanczos vs matfree --------------------------------------------------------------


def lanczos_case(name, n, m, *, budget_s, min_rounds, log, memory_only=False):
    from matfree import decomp

    kp, kv = jax.random.split(jax.random.key(7))
    if name == "dense":
        B = jax.random.normal(kp, (n, n), DTYPE) / np.sqrt(n)
        param = (B + B.T) / 2
        wrap = lambda p: lo.Dense(p, tags={"symmetric"})
        matvec = lambda x, p: p @ x
        what = "dense symmetric (Wigner-like) matrix, `lo.Dense(S, tags={'symmetric'})`; grad w.r.t. S"
    elif name.startswith("kernel"):
        X = jax.random.normal(kp, (n, 2), DTYPE)
        param = lo.KernelGramOp(RBF(0.5, 1.0), X)
        wrap = lambda p: p
        matvec = lambda x, p: p @ x
        tiles = -(-n // param.block_size)
        what = (f"`lo.KernelGramOp(RBF(0.5, 1.0), X)`, X (n, 2) standard normal, {tiles} row tile"
                f"{'s' if tiles > 1 else ''} of {param.block_size}; grad w.r.t. X, lengthscale and variance")
    elif name == "diagonal":
        param = jax.random.uniform(kp, (n,), DTYPE, 0.1, 2.0)
        wrap = lo.Diagonal
        matvec = lambda x, p: p * x
        what = "`lo.Diagonal(d)`, d uniform on [0.1, 2]; grad w.r.t. d"
    else:
        raise ValueError(name)
    v = jax.random.normal(kv, (n,), DTYPE)
    tridiag = decomp.tridiag_sym(m, reortho="full", custom_vjp=True)

    def ours(p, v):
        run = lo.lanczos(wrap(p), m, v0=v)
        return run.alpha, run.beta, run.steps

    def theirs(p, v):
        return tridiag(matvec, v, p).J_small

    def ours_grad(p, v):
        return jax.grad(lambda p: jnp.sum(lo.lanczos(wrap(p), m, v0=v).alpha ** 2))(p)

    def theirs_grad(p, v):
        return jax.grad(lambda p: jnp.sum(jnp.diag(tridiag(matvec, v, p).J_small) ** 2))(p)

    def matvecs(p, v):
        op = wrap(p)
        return lax.fori_loop(0, m, lambda i, x: op.mv(x) / jnp.linalg.norm(x), v)

    fns = {"lo.lanczos": ours, "matfree": theirs, "lo.lanczos grad": ours_grad, "matfree grad": theirs_grad,
           f"{m} matvecs": matvecs}
    progs = {k: H.compile_aot(f, param, v) for k, f in fns.items()}
    if memory_only:  # compiled, not run: XLA's memory analysis of each program
        mem = {k: p[2] for k, p in progs.items()}
        log(f"  {name} n={n} m={m} (memory only): temp MB " + "  ".join(
            f"{k}={mem[k]['temp_size_in_bytes'] / 1e6:.1f}" for k in fns))
        return {"case": name, "operator": what, "n": n, "m": m, "memory_only": True, "memory_analysis": mem,
                "compile_s": {k: p[1] for k, p in progs.items()}}
    first, outs = {}, {}
    for k in fns:
        outs[k], first[k] = H.timed(lambda k=k: progs[k][0](param, v))

    alpha, beta, steps = outs["lo.lanczos"]
    assert int(steps) == m, f"lanczos ({name}) stopped after {int(steps)} of {m} steps: the comparison needs m"
    T_ours = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
    w_ours, w_theirs = jnp.linalg.eigvalsh(T_ours), jnp.linalg.eigvalsh(outs["matfree"])
    checks = {
        "Ritz values vs matfree (rel err)": H.rel_err(w_ours, w_theirs),
        "diag(T) vs matfree (rel err)": H.rel_err(alpha, jnp.diag(outs["matfree"])),
        "gradient vs matfree (rel err)": H.tree_rel_err(outs["lo.lanczos grad"], outs["matfree grad"]),
    }
    assert checks["Ritz values vs matfree (rel err)"] <= 1e-3, checks
    # The two adjoints are different algorithms in float32: agreement to ~1e-2 is what float32 allows here.
    assert checks["gradient vs matfree (rel err)"] <= 5e-2, checks

    calls = {k: (lambda k=k: progs[k][0](param, v)) for k in fns}
    times, n_rounds = H.rounds(calls, budget_s=budget_s, min_rounds=min_rounds, max_rounds=200)
    med = H.medians(times)
    mv = f"{m} matvecs"
    ratios = {"fwd lo.lanczos/matfree": H.ratio(times, "lo.lanczos", "matfree"),
              "grad lo.lanczos/matfree": H.ratio(times, "lo.lanczos grad", "matfree grad"),
              **{f"{k}/{mv}": H.ratio(times, k, mv) for k in list(fns)[:4]}}
    log(f"  {name} n={n} m={m}: rounds={n_rounds} " + "  ".join(f"{k}={med[k]:.4f}s" for k in fns)
        + f"  fwd ratio {ratios['fwd lo.lanczos/matfree']['median']:.3f}"
        f"  grad ratio {ratios['grad lo.lanczos/matfree']['median']:.3f}")
    return {"case": name, "operator": what, "n": n, "m": m, "rounds": n_rounds, "median_s": med,
            "min_s": H.minimums(times), "first_run_s": first, "compile_s": {k: p[1] for k, p in progs.items()},
            "ratios": ratios, "memory_analysis": {k: p[2] for k, p in progs.items()}, "checks": checks}


# --- (c) FSP-Laplace end to end ----------------------------------------------------------


def problem_1d(cfg):
    """The paper's 1-D regression: sin(2 pi x) + N(0, 0.1^2), x on [-1, -0.5] U [0.5, 1]."""
    n = 60
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    side = jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0)
    X = (jax.random.uniform(k1, (n,), DTYPE, 0.5, 1.0) * side)[:, None]
    Y = jnp.sin(2 * jnp.pi * X) + 0.1 * jax.random.normal(k3, (n, 1), DTYPE)
    model = eqx.nn.MLP(1, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(1))
    return {
        "name": "1-D regression", "X": X, "Y": Y, "model": model, "likelihood": Gaussian(0.1),
        "prior_start": RBF(0.3, 1.0), "fit_prior": True, "gp_steps": cfg["gp_steps"],
        "laplace_context": pst.context.grid(X, 100),
        "test": jnp.linspace(-2.0, 2.0, 400, dtype=DTYPE)[:, None],
        "describe": (f"N = {n}, y = sin(2πx) + N(0, 0.1²), x uniform on [−1, −0.5] ∪ [0.5, 1]; 1-50-50-1 tanh "
                     f"MLP (`eqx.nn.MLP`); Gaussian(0.1); RBF prior from `fit_gp(RBF(0.3, 1.0), X, y, "
                     f"noise_variance=0.01, num_steps={cfg['gp_steps']})`; training context "
                     f"`context.uniform(key, X, 100)`; Laplace context `context.grid(X, 100)` (100 points on "
                     f"[−2, 2]); test grid 400 points on [−2, 2]"),
    }


def problem_moons(cfg):
    """Two moons (scikit-learn, 200 points, noise 0.1), 2-100-100-2 tanh MLP, categorical."""
    from sklearn.datasets import make_moons

    Xn, yn = make_moons(n_samples=200, noise=0.1, random_state=0)
    X, Y = jnp.asarray(Xn, DTYPE), jnp.asarray(yn, jnp.int32)
    width = cfg["moons_width"]
    model = eqx.nn.MLP(2, 2, width, 2, activation=jnp.tanh, key=jax.random.key(1))
    g = jnp.linspace(-3.75, 3.75, 10, dtype=DTYPE)
    C = jnp.stack([a.reshape(-1) for a in jnp.meshgrid(g, g, indexing="ij")], axis=1)
    t = jnp.linspace(-3.75, 3.75, cfg["moons_test"], dtype=DTYPE)
    test = jnp.stack([a.reshape(-1) for a in jnp.meshgrid(t, t, indexing="ij")], axis=1)
    return {
        "name": "two moons", "X": X, "Y": Y, "model": model, "likelihood": Categorical(),
        "prior_start": Matern52(1.0, 4.0), "fit_prior": False, "gp_steps": 0,
        "laplace_context": C, "test": test,
        "describe": (f"`make_moons(200, noise=0.1, random_state=0)`; 2-{width}-{width}-2 tanh MLP; Categorical; "
                     "fixed Matérn-5/2 prior (lengthscale 1, variance 4), independent per output; training "
                     "context `context.uniform(key, X, 100)`; Laplace context a 10 × 10 grid on [−3.75, 3.75]²; "
                     f"test grid {cfg['moons_test']} × {cfg['moons_test']} on the same box"),
    }


def _steps(fn, gram_kernel, lik, rank, rtol, restart, P, dtype):
    """``fsp_laplace``'s steps (``posteriors/fsp.py``, ``_algorithm2``) with the public API, in ``dtype``."""
    eps = float(np.finfo(dtype).eps)
    ones = jnp.ones(P, dtype)

    def cutoff(values):
        return values > rtol * jnp.max(jnp.abs(values))

    def s_start(params, C):
        return lo.JacobianOp(fn, params, C) @ ones

    def s_lanczos(k, C, v0):
        run = lo.lanczos(lo.KernelGramOp(k, C), rank, v0=v0, **restart)
        return run.pinv_factor(rtol)

    def s_lanczos_dense(k, C, v0):
        # A reference, not a step of fsp_laplace: the same Lanczos on K_CC formed once, densely.
        run = lo.lanczos(lo.Dense(k(C), tags={"psd"}), rank, v0=v0, **restart)
        return run.pinv_factor(rtol)

    def s_M(params, C, L):
        return lo.JacobianOp(fn, params, C).T @ L

    def s_svd(M):
        U, D, _ = jnp.linalg.svd(M, full_matrices=False)
        keep = cutoff(D)
        return U * keep[None, :], jnp.where(keep, D, 0.0)

    def s_ggn(params, X, Y, U):
        G = lo.GGNOp(fn, params, X, Y, lik)
        return U.T @ (G @ U)

    def s_eigh(GU, U, D):
        # A = D^2 + U^T G U inverted in its whitened form D (I + D^-1 U^T G U D^-1) D: no cut-off on A
        d_inv = jnp.where(D > 0, 1.0 / jnp.where(D > 0, D, 1.0), 0.0)
        B = jnp.eye(D.shape[0], dtype=D.dtype) + d_inv[:, None] * ((GU + GU.T) / 2) * d_inv[None, :]
        lam, U_B = jnp.linalg.eigh(B)
        W, s, _ = jnp.linalg.svd(d_inv[:, None] * U_B / jnp.sqrt(jnp.maximum(lam, 1.0))[None, :], full_matrices=False)
        return U @ W, s**2

    def s_truncate(params, C, k, V, inv):
        JS = lo.JacobianOp(fn, params, C) @ (V * jnp.sqrt(inv)[None, :])
        tail = jnp.cumsum((JS**2)[:, ::-1], axis=1)[:, ::-1]
        tail = jnp.concatenate([tail, jnp.zeros((tail.shape[0], 1), tail.dtype)], axis=1)
        prior_var = lo.diag(lo.KernelGramOp(k, C))
        ok = jnp.all(tail <= prior_var[:, None] * (1 + 10 * eps), axis=0)
        first = jnp.argmax(ok)
        return jnp.where(jnp.arange(inv.shape[0]) >= first, inv, 0.0), first

    return {"start": s_start, "lanczos": s_lanczos, "lanczos_dense": s_lanczos_dense, "M": s_M, "svd": s_svd,
            "ggn": s_ggn, "eigh": s_eigh, "truncate": s_truncate}


def _compare(fn, V, d, post, Z, T):
    """Covariance on the probes ``Z`` and predictive variance on ``T``: the steps' ``(V, d)`` against ``post``."""
    ours_cov = V @ (d[:, None] * (V.T @ Z))
    ref_cov = post.U @ (post.d[:, None] * (post.U.T @ Z))
    ours_var = jnp.sum((lo.JacobianOp(fn, post.params, T) @ (V * jnp.sqrt(d)[None, :])) ** 2, axis=1)
    ref_var = post.predictive(T)[1].reshape(-1)
    return H.rel_err(ours_cov, ref_cov), H.rel_err(ours_var, ref_var)


def float64_identity(fn, params, X, Y, C, T, kernel, gram_kernel, lik, rank, restart):
    """The steps against ``fsp_laplace`` in float64, where rounding cannot hide a difference between them.

    In float32 the two compute the least-determined directions (singular values of M down to ``RTOL_FSP``
    of the largest) in different orders, and those directions' variances are known only to about
    ``2 eps / RTOL_FSP``; in float64 the same steps must agree to rounding.
    """
    with jax.enable_x64(True):
        f64 = lambda t: jax.tree.map(
            lambda a: a.astype(jnp.float64) if eqx.is_array(a) and jnp.issubdtype(a.dtype, jnp.floating) else a, t)
        params, X, Y, C, T, kernel, gram_kernel = f64((params, X, Y, C, T, kernel, gram_kernel))
        P = int(ravel(params)[0].shape[0])
        S = {k: jax.jit(f) for k, f in _steps(fn, gram_kernel, lik, rank, RTOL_FSP, restart, P, jnp.float64).items()}
        L = S["lanczos"](gram_kernel, C, S["start"](params, C))
        U, D = S["svd"](S["M"](params, C, L))
        V, inv = S["eigh"](S["ggn"](params, X, Y, U), U, D)
        d, first = S["truncate"](params, C, gram_kernel, V, inv)
        post = pst.fsp_laplace(fn, params, (X, Y), kernel, C, likelihood=lik)
        Z = jax.random.normal(jax.random.key(3), (P, 8), jnp.float64)
        cov, var = _compare(fn, V, d, post, Z, T)
        return {"float64: covariance Σ Z (8 probes) vs fsp_laplace (rel err)": cov,
                "float64: predictive variance on the test grid vs fsp_laplace (rel err)": var,
                "float64: truncated eigenvalues: steps vs fsp_laplace": int(first) - int(post.info.truncated),
                "float64: rank: steps vs fsp_laplace": int(jnp.sum(D > 0)) - int(post.info.rank)}


def fsp_problem(prob, cfg, *, budget_s, min_rounds, log):
    X, Y, lik = prob["X"], prob["Y"], prob["likelihood"]
    N = X.shape[0]
    split = {}

    # GP fit (as a user calls it: its first call, compile included).
    kernel, prior_extra = prob["prior_start"], {"fixed": True}
    if prob["fit_prior"]:
        fit, split["GP fit (fit_gp, first call)"] = H.first_call(lambda: fit_gp(
            kernel, X, Y[:, 0], noise_variance=0.01, num_steps=prob["gp_steps"]))
        kernel, prior_extra = fit.kernel, {"noise_variance": float(fit.noise_variance)}
    prior_desc = {"kernel": type(kernel).__name__, "lengthscale": float(kernel.lengthscale),
                  "variance": float(kernel.variance), **prior_extra}

    # Training: one jitted scan of Adam; compile and run timed apart.
    import optax

    fn, params0 = from_equinox(prob["model"])
    P = int(ravel(params0)[0].shape[0])
    objective = pst.fsp_objective(fn, kernel, lik, num_data=N,
                                  context=lambda key: pst.context.uniform(key, X, 100))
    opt = optax.adam(3e-3)

    def train(params, X, Y, keys):
        def step(carry, key):
            p, state = carry
            loss, g = jax.value_and_grad(objective)(p, (X, Y), key)
            updates, state = opt.update(g, state, p)
            return (optax.apply_updates(p, updates), state), loss

        (p, _), losses = lax.scan(step, (params, opt.init(params)), keys)
        return p, losses

    keys = jax.random.split(jax.random.key(2), cfg["train_steps"])
    train_c, train_compile_s, _ = H.compile_aot(train, params0, X, Y, keys)
    (params, losses), train_run_s = H.timed(lambda: train_c(params0, X, Y, keys))
    split["training: compile"] = {"first_call_s": train_compile_s}
    split[f"training: {cfg['train_steps']} Adam steps"] = {"first_call_s": train_run_s}
    out = jax.vmap(fn, in_axes=(None, 0))(params, X)
    if isinstance(lik, Gaussian):
        fit_quality = {"train RMSE": float(jnp.sqrt(jnp.mean((out - Y) ** 2)))}
    else:
        fit_quality = {"train accuracy": float(jnp.mean(jnp.argmax(out, axis=1) == Y))}
    log(f"  {prob['name']}: P={P:,}, loss {float(losses[0]):.1f} -> {float(losses[-1]):.1f}, {fit_quality}; "
        f"training compile {train_compile_s:.2f}s, run {train_run_s:.2f}s")

    # fsp_laplace itself: the first call (compile) ...
    C = prob["laplace_context"]
    laplace = lambda: pst.fsp_laplace(fn, params, (X, Y), kernel, C, likelihood=lik)
    post, laplace_first = H.first_call(laplace)
    info = {f.name: np.asarray(getattr(post.info, f.name)).item() for f in dataclasses.fields(post.info)}

    # ... and its steps, as `posteriors/fsp.py` (`_algorithm2`) takes them, with the public API.
    num_outputs = int(jax.eval_shape(fn, params, X[0]).shape[0])
    gram_kernel = pst.GPPrior(kernel).kernel_for(num_outputs)
    nC = C.shape[0] * num_outputs
    rank = min(500, nC)
    restart = {"restart": True} if "restart" in inspect.signature(lo.lanczos).parameters else {}
    S = _steps(fn, gram_kernel, lik, rank, RTOL_FSP, restart, P, DTYPE)
    s_start, s_lanczos, s_lanczos_dense, s_M, s_svd = (S[k] for k in ("start", "lanczos", "lanczos_dense", "M", "svd"))
    s_ggn, s_eigh, s_truncate = S["ggn"], S["eigh"], S["truncate"]

    def s_predictive(post, T):
        return post.predictive(T)

    T = prob["test"]
    steps = {}  # name -> (compiled, args)
    compile_s = {}

    def add(name, fn_, *args):
        compiled, seconds, _ = H.compile_aot(fn_, *args)
        compile_s[name] = seconds
        steps[name] = (compiled, args)
        out, _ = H.timed(lambda: compiled(*args))
        return out

    v0 = add("start vector J(C) 1", s_start, params, C)
    L = add(f"Lanczos on K_CC ({rank} steps) + pinv factor", s_lanczos, gram_kernel, C, v0)
    M = add("M = J(C)ᵀ L (VJPs)", s_M, params, C, L)
    U, D = add("thin SVD of M", s_svd, M)
    GU = add("Uᵀ G U of A = D² + Uᵀ G U (GGN products)", s_ggn, params, X, Y, U)
    V, inv = add("A⁻¹ in whitened form (eigh + SVD), V = U W", s_eigh, GU, U, D)
    d, first = add("truncation (J(C) S, prior-variance test)", s_truncate, params, C, gram_kernel, V, inv)
    add(f"predictive on the test grid ({T.shape[0]} points)", s_predictive, post, T)
    L_dense = add(REF_DENSE_LANCZOS, s_lanczos_dense, gram_kernel, C, v0)
    step_names = list(steps)
    algorithm_steps = step_names[:-2]

    # The steps give fsp_laplace's posterior: its covariance on probes, and the predictive variance.
    Z = jax.random.normal(jax.random.key(3), (P, 8), DTYPE)
    cov, var = _compare(fn, V, d, post, Z, T)
    checks = {
        "covariance Σ Z (8 probes) vs fsp_laplace (rel err)": cov,
        "predictive variance on the test grid vs fsp_laplace (rel err)": var,
        "truncated eigenvalues: steps vs fsp_laplace": int(first) - int(info["truncated"]),
        "reference: L Lᵀ v0 from the dense K_CC vs from KernelGramOp (rel err)": H.rel_err(
            L_dense @ (L_dense.T @ v0), L @ (L.T @ v0)),
    }
    # That the steps ARE fsp_laplace's is checked in float64, where the two must agree to rounding (4.6e-10 and
    # 1.8e-10 measured on the quick 1-D problem; 1e-8 asserted).
    checks.update(float64_identity(fn, params, X, Y, C, T, kernel, gram_kernel, lik, rank, restart))
    assert checks["float64: covariance Σ Z (8 probes) vs fsp_laplace (rel err)"] <= 1e-8, checks
    assert checks["float64: predictive variance on the test grid vs fsp_laplace (rel err)"] <= 1e-8, checks
    assert checks["float64: truncated eigenvalues: steps vs fsp_laplace"] == 0, checks
    assert checks["float64: rank: steps vs fsp_laplace"] == 0, checks
    # In float32 (the timed programs) the two orderings agree only as far as float32 determines the answer.
    # fsp_laplace keeps the singular values of M down to RTOL_FSP = 1e-6 of the largest (posteriors/fsp.py says
    # why: a float32-scaled cut-off dropped directions the data need). Such a value carries an absolute rounding
    # error of about eps times the largest, so a relative one of eps / RTOL_FSP = 0.12, and the variance in its
    # direction, 1 / D², twice that: the largest variances, which dominate both checks, are known to 2 eps / RTOL_FSP.
    # Measured 0.11 and 7.2e-3 on the quick 1-D problem. (At the earlier float32 cut-off max(1e-6, n_C O eps) the
    # two agreed to 5e-3, but that cut-off dropped 33 of 43 directions on the weekly Mauna Loa record.)
    f32_bound = 2 * float(np.finfo(DTYPE).eps) / RTOL_FSP
    assert checks["covariance Σ Z (8 probes) vs fsp_laplace (rel err)"] <= f32_bound, checks
    assert checks["predictive variance on the test grid vs fsp_laplace (rel err)"] <= f32_bound, checks
    assert checks["truncated eigenvalues: steps vs fsp_laplace"] == 0, checks

    # Steady state: the steps and fsp_laplace, interleaved.
    calls = {name: (lambda name=name: steps[name][0](*steps[name][1])) for name in step_names}
    calls["fsp_laplace (whole)"] = laplace
    times, n_rounds = H.rounds(calls, budget_s=budget_s, min_rounds=min_rounds, max_rounds=100)
    med = H.medians(times)
    sum_steps = [sum(times[s][r] for s in algorithm_steps) for r in range(n_rounds)]
    sum_ratio = H.ratio({"sum": sum_steps, "whole": times["fsp_laplace (whole)"]}, "sum", "whole")
    share = {s: med[s] / statistics.median(sum_steps) for s in algorithm_steps}
    log(f"  {prob['name']}: fsp_laplace first call {laplace_first['first_call_s']:.2f}s, steady "
        f"{med['fsp_laplace (whole)']:.4f}s, sum of steps {statistics.median(sum_steps):.4f}s "
        f"(ratio {sum_ratio['median']:.2f}); rounds={n_rounds}; info {info}")
    log("    " + "  ".join(f"{s.split(' (')[0]}={med[s] * 1e3:.2f}ms" for s in step_names))
    return {
        "problem": prob["name"], "describe": prob["describe"], "num_params": P, "num_data": int(N),
        "num_outputs": num_outputs, "context_rows": nC, "lanczos_steps_asked": rank, "lanczos_kwargs": restart,
        "prior": prior_desc, "train_steps": cfg["train_steps"], "loss_first_last": [float(losses[0]),
                                                                                    float(losses[-1])],
        "fit": fit_quality, "split": split, "fsp_laplace_first_call": laplace_first, "info": info,
        "steps": step_names, "algorithm_steps": algorithm_steps, "step_compile_s": compile_s,
        "rounds": n_rounds, "median_s": med, "min_s": H.minimums(times),
        "sum_of_steps_median_s": statistics.median(sum_steps), "sum_of_steps/fsp_laplace": sum_ratio,
        "share_of_sum": share, "checks": checks,
    }


def _t(s):
    if s is None:
        return "—"
    return f"{s:.3f}" if s >= 0.1 else (f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs")


def _checks(c, fmt=".1e"):
    return ", ".join(f"{k.replace(' (rel err)', '')} {v:{fmt}}" for k, v in c["checks"].items())


def _gram_row(c, m, limit):
    mem = c["memory_analysis"][m]
    if c["status"][m] != "run":
        return (c["kernel"], f"{c['n']:,}", m, "—", "—", H.mb(mem["temp_size_in_bytes"]), H.mb(mem["total"]), "—",
                f"**does not fit**: needs {lo.memory.format_bytes(c['dense_bytes_needed'][m])} > "
                f"{lo.memory.format_bytes(limit)} budget; not run")
    return (c["kernel"], f"{c['n']:,}", m, _t(c["median_s"][m]),
            "1" if m == "tiled" else H.iqr(c["ratios"][f"{m}/tiled"]),
            H.mb(mem["temp_size_in_bytes"]), H.mb(mem["total"]), _t(c["first_run_s"][m]),
            f"form Gram {_t(c['form_gram_s'])}" if m == "dense (precomputed)" else "")


def _lanczos_row(c):
    mv, md, rr = f"{c['m']} matvecs", c["median_s"], c["ratios"]
    return (c["case"], f"{c['n']:,}", c["m"], _t(md["lo.lanczos"]), _t(md["matfree"]),
            H.iqr(rr["fwd lo.lanczos/matfree"]),
            _t(md["lo.lanczos grad"]), _t(md["matfree grad"]), H.iqr(rr["grad lo.lanczos/matfree"]), _t(md[mv]),
            f"{rr[f'lo.lanczos/{mv}']['median']:.2f}, {rr[f'matfree/{mv}']['median']:.2f}",
            f"{rr[f'lo.lanczos grad/{mv}']['median']:.2f}, {rr[f'matfree grad/{mv}']['median']:.2f}", c["rounds"])


def _kv(d, sep=" = ", fmt=".4g"):
    return ", ".join(f"{k}{sep}{v:{fmt}}" if isinstance(v, float) else f"{k}{sep}{v}" for k, v in d.items())


def _fsp_section(p):
    med = p["median_s"]
    rows = [(k, _t(rep["first_call_s"]), "", "" if rep.get("xla_compile_s") is None
             else f"included: {_t(rep['xla_compile_s'])} XLA compile") for k, rep in p["split"].items()]
    for st in p["steps"]:
        share = p["share_of_sum"].get(st)
        rows.append((f"Laplace step: {st}" if st in p["algorithm_steps"] else st, _t(med[st]),
                     "" if share is None else f"{share:.1%}", _t(p["step_compile_s"][st])))
    lf = p["fsp_laplace_first_call"]
    rows += [("**sum of the Laplace steps** (predictive excluded)", _t(p["sum_of_steps_median_s"]), "100%",
              _t(sum(p["step_compile_s"][s] for s in p["algorithm_steps"]))),
             ("**`fsp_laplace`**, steady state", _t(med["fsp_laplace (whole)"]), "", ""),
             ("**`fsp_laplace`**, first call (trace / lower / XLA compile)",
              f"{_t(lf['first_call_s'])} ({' / '.join(_t(lf[k]) for k in ('trace_s', 'lower_s', 'xla_compile_s'))})",
              "", "")]
    return [
        f"### {p['problem']}",
        "",
        p["describe"] + f". P = {p['num_params']:,} parameters, {p['context_rows']} context rows "
        f"(n_C · O), {p['train_steps']:,} training steps (loss {p['loss_first_last'][0]:.1f} → "
        f"{p['loss_first_last'][1]:.1f}; " + _kv(p["fit"], " ", ".3f") + ").",
        *H.table(("step", "time", "share of the Laplace steps", "compile (excluded)"), rows),
        f"Sum of the steps / `fsp_laplace` per round: {H.iqr(p['sum_of_steps/fsp_laplace'])} ({p['rounds']} rounds). "
        f"`fsp_laplace` info: {_kv(p['info'])}. Prior: {_kv(p['prior'], ' ')}. Checks: {_kv(p['checks'], fmt='.1e')}.",
        "",
    ]


def markdown(report) -> str:
    res, info, limit = report["result"], report["machine"], report["dense_limit_bytes"]
    timed_cases = [c for c in res["lanczos"] if not c.get("memory_only")]
    lines = [
        f"# FSP-Laplace and its building blocks (`benchmarks/{report['benchmark']}.py`)",
        "",
        f"`{report['command']}`: {report['total_s']:.0f} s in all. float32 on {info['cpus_usable']} CPU cores; times "
        "are medians of interleaved rounds, ratios the medians (and interquartile ranges) of per-round ratios.",
        *H.section("Key numbers"),
        *H.table(("quantity", "value"), [(k, v if isinstance(v, str) else f"{v:.3f}")
                                         for k, v in report["summary"].items()]),
        *H.section("KernelGramOp products against a dense Gram matvec"),
        "`tiled`: `jax.jit(lambda K, v: K @ v)` with `K = lo.KernelGramOp(k, X)` (row tiles of about 2²² "
        "numbers, one `lax.map`); `dense (form + matvec)`: `k(X) @ v` in one jitted function; "
        "`dense (precomputed)`: `G @ v` with `G = k(X)` formed beforehand (the best case for dense when "
        "it fits; forming it is the *form Gram* column); `hand-tiled` (a reference, not a method of the "
        "library): the same row blocks written by hand with the squared distance summed per input "
        "dimension. Inputs `X` (n, 2) standard normal, lengthscale 0.5, variance 1. Memory: XLA's "
        "memory analysis of each compiled program (arguments + output + temp; MB = 10⁶ bytes); a "
        "dense route runs only where `lo.memory.check_fits` accepts its program's total within the "
        f"dense budget of {limit / 1e9:.1f} GB (the smaller of "
        "`--dense-limit-gb` and half the memory available at start: the machine is shared).",
        *H.table(("kernel", "n", "method", "time per product", "× tiled", "temp MB", "total MB", "first run", "note"),
                 [_gram_row(c, m, limit) for c in res["gram"] for m in GRAM_METHODS], "lrlrrrrrl"),
    ]
    avail = report.get("available_bytes_at_start")
    if avail:
        lines += ["", f"Memory available at start: {lo.memory.format_bytes(avail)}; a float32 dense Gram alone "
                  f"(n² · 4 bytes) exceeds that from n ≈ {int(math.sqrt(avail / 4)):,}, and the dense budget from "
                  f"n ≈ {int(math.sqrt(limit / 4)):,}."]
    lines += [
        "",
        "The tiled product's temp memory by n (the dense Gram alone is n² · 4 bytes):",
        *H.table(("kernel", "n", "block rows", "tiled temp MB", "tiled total MB", "dense Gram MB",
                  "dense (form + matvec) total MB"),
                 [(c["kernel"], f"{c['n']:,}", c["block_size"], *(H.mb(c["memory_analysis"]["tiled"][k]) for k in (
                     "temp_size_in_bytes", "total")), H.mb(c["dense_gram_bytes"]),
                   H.mb(c["memory_analysis"]["dense (form + matvec)"]["total"])) for c in res["gram"]]),
        "Checks before timing (relative error against `tiled`, ≤ 1e-4): "
        + "; ".join(f"{c['kernel']} n={c['n']:,}: {_checks(c)}" for c in res["gram"]) + ".",
        *H.section("Lanczos against matfree"),
        "`lo.lanczos(A, m, v0=v)` (full reorthogonalisation, row-stored basis, custom adjoint) against "
        "`matfree.decomp.tridiag_sym(m, reortho=\"full\", custom_vjp=True)` with the matvec "
        "`lambda x, p: p @ x` (the operator's array as its parameter). *grad*: `jax.grad` of "
        "`sum(diag(T)²)` w.r.t. the operator's arrays. *m matvecs*: a jitted `fori_loop` of m products "
        "(normalised), the floor for any m-step Lanczos. Every program jitted; compile excluded.",
        *H.table(("case", "n", "m", "lo.lanczos", "matfree", "fwd ours / matfree", "lo.lanczos grad", "matfree grad",
                  "grad ours / matfree", "m matvecs", "fwd ÷ m matvecs (ours, matfree)",
                  "grad ÷ m matvecs (ours, matfree)", "rounds"), [_lanczos_row(c) for c in timed_cases]),
        "Operators: " + "; ".join(f"*{c['case']}*: {c['operator']}" for c in timed_cases) + ".",
        "",
        "Checks before timing: " + "; ".join(f"{c['case']}: {_checks(c)}" for c in timed_cases)
        + " (relative errors; asserted: Ritz values ≤ 1e-3, gradients ≤ 5e-2, the two adjoints being different "
        "algorithms run in float32; and `lo.lanczos` ran all m steps).",
        "",
        "Memory of each compiled program (temp MB, XLA memory analysis; *compiled only* rows were not run). "
        "A gradient w.r.t. a `KernelGramOp`'s arrays ends in one VJP of the tiled product, which recomputes "
        "each tile in the backward pass (`jax.checkpoint`): its temp memory grows with n, not n². With a "
        "single row tile, XLA can hoist the loop-invariant Gram out of matfree's loop (one kernel "
        "evaluation instead of m); it does not for `lo.lanczos`'s data-dependent `while_loop`, hence "
        "matfree's lead in that case' forward pass.",
        *H.table(("case", "n", "lo.lanczos", "matfree", "lo.lanczos grad", "matfree grad", "m matvecs"),
                 [(f"{c['case']} (compiled only)" if c.get("memory_only") else c["case"], f"{c['n']:,}",
                   *(H.mb(c["memory_analysis"][k]["temp_size_in_bytes"]) for k in (
                       "lo.lanczos", "matfree", "lo.lanczos grad", "matfree grad", f"{c['m']} matvecs")))
                  for c in res["lanczos"]]),
        *H.section("FSP-Laplace end to end, time split by step"),
        "Training: `posteriors.fsp_objective` and optax Adam (3e-3), one jitted `lax.scan` (compiled "
        "ahead, then run once). Laplace step: `posteriors.fsp_laplace(fn, params, (X, Y), kernel, C, "
        "likelihood=...)` (defaults: rank min(500, n_C·O), rtol 1e-6); its steps below are "
        "`_algorithm2`'s (`posteriors/fsp.py`) written with the public API, each a jitted function "
        "(compiled ahead; compile excluded), called in interleaved rounds with `fsp_laplace` itself. "
        "The steps' result is checked against `fsp_laplace`'s posterior before timing.",
        "",
    ]
    for p in res["fsp"]:
        lines += _fsp_section(p)
    return H.render(lines + H.machine(report))


def config_for(quick: bool, kernel_lanczos_n: int | None):
    if quick:
        cfg = {"gram": [("RBF", 500), ("Matern52", 500), ("RBF", 2000)],
               "lanczos": [("dense", 300, 20), ("kernel", 300, 20), ("diagonal", 20_000, 20)],
               "lanczos_memory_only": [("kernel", 1000, 20)],
               "gp_steps": 20, "train_steps": 200, "budget_s": 0.5, "min_rounds": 2, "moons_width": 16,
               "moons_test": 20}
    else:
        cfg = {"gram": [("RBF", 1000), ("Matern52", 1000), ("RBF", 10_000), ("Matern52", 10_000), ("RBF", 50_000)],
               "lanczos": [("dense", 2000, 100), ("kernel, one tile", 1000, 100), ("kernel", 2000, 100),
                           ("diagonal", 100_000, 100)],
               "lanczos_memory_only": [("kernel", 10_000, 100)],
               "gp_steps": 300, "train_steps": 6000, "budget_s": 20.0, "min_rounds": 3, "moons_width": 100,
               "moons_test": 50}
    if kernel_lanczos_n:
        cfg["lanczos"] = [(c, kernel_lanczos_n if c == "kernel" else n, m) for c, n, m in cfg["lanczos"]]
    return cfg


def summarise(gram, lanczos, fsp):
    summary = {}
    for c in gram:
        tag = f"Gram {c['kernel']} n={c['n']:,}"
        summary[f"{tag}: time × tiled of dense (form + matvec) / dense (precomputed) / hand-tiled"] = " / ".join(
            f"{c['ratios'][f'{m}/tiled']['median']:.3f}" if c["status"][m] == "run" else
            f"not run: needs {lo.memory.format_bytes(c['dense_bytes_needed'][m])}"
            for m in (*GRAM_METHODS[2:], "hand-tiled"))
        summary[f"{tag}: tiled temp MB / dense Gram MB"] = (
            f"{c['memory_analysis']['tiled']['temp_size_in_bytes'] / 1e6:,.1f} / {c['dense_gram_bytes'] / 1e6:,.0f}")
    for c in (c for c in lanczos if not c.get("memory_only")):
        summary[f"Lanczos {c['case']} n={c['n']:,} m={c['m']}: ours / matfree, forward / gradient"] = (
            " / ".join(f"{c['ratios'][f'{k} lo.lanczos/matfree']['median']:.3f}" for k in ("fwd", "grad")))
    for f in fsp:
        top = max(f["share_of_sum"], key=f["share_of_sum"].get)
        summary[f"FSP {f['problem']}: fsp_laplace steady / first call (s)"] = (
            f"{f['median_s']['fsp_laplace (whole)']:.3f} / {f['fsp_laplace_first_call']['first_call_s']:.2f}")
        summary[f"FSP {f['problem']}: sum of steps / fsp_laplace"] = f["sum_of_steps/fsp_laplace"]["median"]
        summary[f"FSP {f['problem']}: largest step"] = f"{top.split(' (')[0]} ({f['share_of_sum'][top]:.0%})"
        summary[f"FSP {f['problem']}: Lanczos on K_CC, dense reference / KernelGramOp"] = (
            f["median_s"][REF_DENSE_LANCZOS] / f["median_s"][f["algorithm_steps"][1]])
    return summary


def main(argv=None):
    run = H.Run(__file__, __doc__, argv, budget=(float, "target seconds of timing rounds per case"),
                dense_limit_gb=(float, "largest dense Gram program run (GB, default 4; at most half the available "
                                       "memory)"),
                kernel_lanczos_n=(int, "size of the KernelGramOp Lanczos case (default 2000; 300 with --quick)"))
    q, a = run.quick, run.args
    cfg = config_for(q, a.kernel_lanczos_n)
    budget, min_rounds = a.budget or cfg["budget_s"], cfg["min_rounds"]
    available = lo.memory.available_bytes()
    dense_limit = int((a.dense_limit_gb or 4.0) * 1e9)
    if available is not None:
        dense_limit = min(dense_limit, available // 2)
    run.log(f"~{budget:.0f}s of rounds per case (at least {min_rounds}); dense budget {dense_limit / 1e9:.1f} GB")
    t0 = time.perf_counter()
    run.log("(a) KernelGramOp products vs a dense Gram matvec")
    # The largest case: a product takes tens of seconds on 2 cores, so one round after the first run.
    gram = [gram_case(k, n, dense_limit=dense_limit, budget_s=budget, min_rounds=1 if n >= 50_000 else min_rounds,
                      log=run.log) for k, n in cfg["gram"]]
    t1 = time.perf_counter()
    run.log("(b) Lanczos vs matfree")
    # The kernel case is slow (each product evaluates n² kernel entries): fewer rounds.
    lanczos = [lanczos_case(name, n, m, budget_s=budget, min_rounds=2 if (name == "kernel" and not q) else min_rounds,
                            log=run.log) for name, n, m in cfg["lanczos"]]
    lanczos += [lanczos_case(name, n, m, budget_s=budget, min_rounds=1, log=run.log, memory_only=True)
                for name, n, m in cfg["lanczos_memory_only"]]
    t2 = time.perf_counter()
    run.log("(c) FSP-Laplace end to end")
    fsp = [fsp_problem(make(cfg), cfg, budget_s=min(budget, 10.0), min_rounds=min_rounds if q else max(min_rounds, 5),
                       log=run.log) for make in (problem_1d, problem_moons)]
    section_s = {"gram": t1 - t0, "lanczos": t2 - t1, "fsp": time.perf_counter() - t2}

    import optax
    import sklearn

    run.write({"section_s": section_s, "dense_limit_bytes": dense_limit, "available_bytes_at_start": available,
               "summary": summarise(gram, lanczos, fsp), "result": {"gram": gram, "lanczos": lanczos, "fsp": fsp}},
              markdown, machine={"matfree": importlib.metadata.version("matfree"), "optax": optax.__version__,
                                 "scikit-learn": sklearn.__version__})


if __name__ == "__main__":
    main()
