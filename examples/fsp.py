"""FSP-Laplace on the paper's two toy problems, with different Gaussian-process priors.

Cinquin et al. (NeurIPS 2024), figures 1 and C.2-C.6: the same network, trained with the
FSP objective and given a Laplace posterior under different GP priors, inherits each
prior's smoothness, roughness or periodicity.

- 1-D regression: y = sin(2 pi x) + N(0, 0.1^2), x uniform on [-1, -0.5] U [0.5, 1], a 2 x 50
  tanh MLP, priors RBF / Matern-1/2 / periodic with hyperparameters fitted by the exact GP
  marginal likelihood (as the paper does), 100 grid context points for the Laplace step.
- Two moons (noise 0.1): a 2 x 100 tanh MLP with two outputs, Matern-5/2, RBF and Matern-1/2
  priors (lengthscale 1, variance 1), a 10 x 10 grid of context points over [-3.75, 3.75]^2.

Writes ``fsp_regression.png`` and ``fsp_two_moons.png`` (and a ``fsp_summary.json``) to
``--out`` (default ``examples/figures``). Needs the ``examples`` extra
(``pip install -e ".[examples]"``: matplotlib and scikit-learn).

    python examples/fsp.py            # about 2 minutes on 2 CPU cores
    python examples/fsp.py --quick    # a smoke run, fewer steps
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import posteriors as pst
from linops.kernels import RBF, Matern12, Matern52, Periodic, fit_gp
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox


def train(fn, params, objective, data, *, steps, learning_rate, key):
    """Adam on ``objective(params, data, key)``, fresh context points each step, one jitted scan."""
    opt = optax.adam(learning_rate)

    @jax.jit
    def run(params):
        def step(carry, k):
            p, state = carry
            value, grads = jax.value_and_grad(objective)(p, data, k)
            updates, state = opt.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), value

        (p, _), history = jax.lax.scan(step, (params, opt.init(params)), jax.random.split(key, steps))
        return p, history

    return run(params)


def gp_prior_samples(kernel, grid, key, n):
    """Draws of the GP prior on a grid, by the symmetric square root of the dense Gram (the grid is
    small; unlike a Cholesky it does not need a jitter for the numerically low-rank periodic Gram)."""
    w, V = jnp.linalg.eigh(kernel(grid))
    root = V * jnp.sqrt(jnp.clip(w, 0.0, None))[None, :]
    return (root @ jax.random.normal(key, (grid.shape[0], n))).T


def regression(out, quick, log):
    import matplotlib.pyplot as plt

    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    n = 60
    side = jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0)
    X = (jax.random.uniform(k1, (n,), minval=0.5, maxval=1.0) * side)[:, None]
    Y = jnp.sin(2 * jnp.pi * X) + 0.1 * jax.random.normal(k3, (n, 1))
    grid = jnp.linspace(-2.0, 2.0, 200)[:, None]
    context = pst.context.grid(X, 100)  # 100 points on the data box padded by half its range: [-2, 2]
    priors = {"RBF": RBF(0.3, 1.0), "Matérn-1/2": Matern12(0.5, 1.0), "periodic": Periodic(1.0, 1.0, 1.0)}
    steps = 1500 if quick else 6000
    fig, axes = plt.subplots(2, len(priors), figsize=(4.2 * len(priors), 6.5), sharex=True)
    summary = {}
    for col, (name, start) in enumerate(priors.items()):
        t0 = time.perf_counter()
        kernel = fit_gp(start, X, Y[:, 0], noise_variance=0.01, num_steps=300).kernel  # the paper's prior fit
        fn, params = from_equinox(eqx.nn.MLP(1, 1, 50, 2, activation=jnp.tanh, key=jax.random.key(1)))
        objective = pst.fsp_objective(fn, kernel, Gaussian(0.1), num_data=n,
                                      context=lambda k: pst.context.uniform(k, X, 100))
        params, history = train(fn, params, objective, (X, Y), steps=steps, learning_rate=3e-3,
                                key=jax.random.key(2))
        t1 = time.perf_counter()
        post = pst.fsp_laplace(fn, params, (X, Y), kernel, context, likelihood=Gaussian(0.1))
        mean, var = post.predictive(grid)
        jax.block_until_ready(var)
        t2 = time.perf_counter()
        samples = post.predictive_samples(jax.random.key(3), grid, 8)[:, :, 0]
        std = jnp.sqrt(var[:, 0])
        gap = jnp.abs(grid[:, 0]) < 0.35
        summary[name] = {
            "kernel": {k: np.asarray(v).tolist() for k, v in vars(kernel).items() if isinstance(v, jax.Array)},
            "train_s": round(t1 - t0, 2), "laplace_s": round(t2 - t1, 2), "final_objective": float(history[-1]),
            "lanczos_steps": int(post.info.lanczos_steps), "rank": int(post.info.rank),
            "truncated": int(post.info.truncated),
            "gap_rmse_to_sin": float(jnp.sqrt(jnp.mean((mean[gap, 0] - jnp.sin(2 * jnp.pi * grid[gap, 0])) ** 2))),
            "edge_abs_mean": float(jnp.max(jnp.abs(mean[jnp.abs(grid[:, 0]) > 1.8, 0]))),
        }
        log(f"regression {name}: {summary[name]}")
        top, bottom = axes[0, col], axes[1, col]
        for s in gp_prior_samples(kernel, grid, jax.random.key(4), 5):
            top.plot(grid[:, 0], s, lw=1, alpha=0.8)
        top.set_title(f"GP prior: {name}")
        bottom.fill_between(grid[:, 0], mean[:, 0] - 2 * std, mean[:, 0] + 2 * std, color="tab:green", alpha=0.25,
                            label="±2 std")
        for s in samples:
            bottom.plot(grid[:, 0], s, color="tab:green", lw=0.7, alpha=0.6)
        bottom.plot(grid[:, 0], mean[:, 0], color="tab:red", lw=1.5, label="mean")
        bottom.scatter(X[:, 0], Y[:, 0], s=10, color="0.4", zorder=3, label="data")
        bottom.set_ylim(-3, 3)
        bottom.set_title(f"FSP-Laplace posterior: {name}")
    axes[1, 0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fsp_regression.png", dpi=120)
    plt.close(fig)
    return summary


def two_moons(out, quick, log):
    import matplotlib.pyplot as plt
    from sklearn.datasets import make_moons

    Xn, yn = make_moons(n_samples=200, noise=0.1, random_state=0)
    X, Y = jnp.asarray(Xn, jnp.float32), jnp.asarray(yn, jnp.int32)
    lim = 3.75
    axis = jnp.linspace(-lim, lim, 80)
    grid = jnp.stack(jnp.meshgrid(axis, axis, indexing="xy"), axis=-1).reshape(-1, 2)
    c = jnp.linspace(-lim, lim, 10)
    context = jnp.stack(jnp.meshgrid(c, c, indexing="xy"), axis=-1).reshape(-1, 2)  # the paper's 10 x 10 grid
    # Fixed hyperparameters (lengthscale 1, variance 1): the paper fits them with Milios et al.'s
    # transformation of labels into regression targets; an exact GP fit of the labels as +-1
    # targets gives lengthscales (0.17-0.37) shorter than the context grid's spacing (0.83), where
    # the prior no longer ties the context points together.
    priors = {"Matérn-5/2": Matern52(1.0, 1.0), "RBF": RBF(1.0, 1.0), "Matérn-1/2": Matern12(1.0, 1.0)}
    steps = 1000 if quick else 4000
    fig, axes = plt.subplots(2, len(priors), figsize=(4.2 * len(priors), 8))
    summary = {}
    for col, (name, start) in enumerate(priors.items()):
        t0 = time.perf_counter()
        kernel = start
        fn, params = from_equinox(eqx.nn.MLP(2, 2, 100, 2, activation=jnp.tanh, key=jax.random.key(1)))
        objective = pst.fsp_objective(fn, kernel, Categorical(), num_data=X.shape[0],
                                      context=lambda k: pst.context.uniform(k, X, 100))
        params, history = train(fn, params, objective, (X, Y), steps=steps, learning_rate=3e-3,
                                key=jax.random.key(2))
        t1 = time.perf_counter()
        post = pst.fsp_laplace(fn, params, (X, Y), kernel, context, likelihood=Categorical(), context_batch_size=50)
        logits = post.predictive_samples(jax.random.key(3), grid, 100)  # (100, M, 2)
        p1 = jax.nn.softmax(logits, axis=-1)[..., 1]
        jax.block_until_ready(p1)
        t2 = time.perf_counter()
        pred = jnp.argmax(jax.vmap(fn, in_axes=(None, 0))(params, X), axis=-1)
        summary[name] = {
            "kernel": {k: np.asarray(v).tolist() for k, v in vars(kernel).items() if isinstance(v, jax.Array)},
            "train_s": round(t1 - t0, 2), "laplace_and_predict_s": round(t2 - t1, 2),
            "train_accuracy": float(jnp.mean(pred == Y)), "lanczos_steps": int(post.info.lanczos_steps),
            "rank": int(post.info.rank), "truncated": int(post.info.truncated),
            "corner_p1_mean": float(jnp.mean(p1, axis=0)[0]), "corner_p1_std": float(jnp.std(p1, axis=0)[0]),
        }
        log(f"two moons {name}: {summary[name]}")
        for row, (values, label, cmap) in enumerate(((jnp.mean(p1, axis=0), "mean p(class 1)", "RdBu_r"),
                                                     (jnp.std(p1, axis=0), "std p(class 1)", "viridis"))):
            ax = axes[row, col]
            im = ax.imshow(values.reshape(axis.shape[0], axis.shape[0]), origin="lower", cmap=cmap,
                           extent=(-lim, lim, -lim, lim), vmin=0, vmax=1 if row == 0 else None)
            ax.scatter(X[:, 0], X[:, 1], c=np.where(np.asarray(Y) == 1, "tab:red", "tab:blue"), s=6,
                       edgecolors="white", linewidths=0.3)
            ax.set_title(f"{name}: {label}")
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(out / "fsp_two_moons.png", dpi=110)
    plt.close(fig)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer training steps (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "figures")
    parser.add_argument("--only", choices=["regression", "two_moons"], help="run one of the two problems")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    summary = {"quick": args.quick}
    if args.only in (None, "regression"):
        summary["regression"] = regression(args.out, args.quick, log)
    if args.only in (None, "two_moons"):
        summary["two_moons"] = two_moons(args.out, args.quick, log)
    (args.out / "fsp_summary.json").write_text(json.dumps(summary, indent=2))
    log(f"wrote {args.out / 'fsp_regression.png'}, {args.out / 'fsp_two_moons.png'}, {args.out / 'fsp_summary.json'}")


if __name__ == "__main__":
    main()
