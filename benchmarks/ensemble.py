#!/usr/bin/env python
"""Deep ensembles on CPU: the members trained in turn against vectorised over the members.

``pst.deep_ensemble`` trains its members one after another on CPU when the network has convolutions
(vectorised over the members' weights, a convolution becomes a grouped convolution, which XLA's CPU
backend runs slowly) and vectorised otherwise. This measures both programs, as called (compile
included, the way an experiment calls it), on LeNet-5 (61,706 float32 parameters, MNIST digits) and on
a 784-100-100-10 tanh MLP: 5 members, 200 Adam steps of 128 examples. Agreement check before timing:
the two programs give the same members after 5 steps (to float32 rounding of the summation order). See
``benchmarks/README.md``.

Run:  python benchmarks/ensemble.py            # full run (about 4 minutes on 2 cores)
      python benchmarks/ensemble.py --quick    # smoke run (small LeNet on random 12 x 12 images)
"""

from __future__ import annotations

import _harness as H
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import posteriors as pst
import posteriors.ensemble as ensemble
from linops.likelihoods import Categorical
from linops.models import from_equinox
from posteriors.experiments.architectures import lenet5


def problem(name, quick):
    if quick:
        X = jax.random.normal(jax.random.PRNGKey(1), (64, 1, 12, 12), jnp.float32)
        y = jax.random.randint(jax.random.PRNGKey(2), (64,), 0, 10)
        if name == "mlp":
            return (lambda k: from_equinox(eqx.nn.MLP(144, 10, 16, 2, activation=jnp.tanh, key=k))), \
                X.reshape(64, -1), y
        return (lambda k: lenet5(k, size="small", dtype=jnp.float32)), X, y
    from posteriors import data as pdata

    images, labels = pdata.load_images("mnist")
    images, y = np.asarray(images[:2000], np.float32), jnp.asarray(labels[:2000])
    if name == "mlp":
        return (lambda k: from_equinox(eqx.nn.MLP(784, 10, 100, 2, activation=jnp.tanh, key=k))), \
            jnp.asarray(images.reshape(2000, -1)), y
    return (lambda k: lenet5(k, width=1.0, image_size=28, dtype=jnp.float32)), jnp.asarray(images[:, None]), y


def run_model(name, cfg, *, log, quick):
    build, X, y = problem(name, quick)
    fn, params = build(jax.random.PRNGKey(0))
    init = lambda k: build(k)[1]  # noqa: E731
    chosen = ensemble._members_in_turn
    P = sum(a.size for a in jax.tree_util.tree_leaves(params))

    record = {}

    def train(in_turn, steps=cfg["steps"]):  # records what the library would choose, runs the program asked for
        ensemble._members_in_turn = lambda *a: (record.setdefault("in turn", chosen(*a)), in_turn)[1]
        try:
            return pst.deep_ensemble(fn, init, (X, y), Categorical(), key=jax.random.PRNGKey(3),
                                     num_members=cfg["members"], num_steps=steps, batch_size=cfg["batch"],
                                     progress=False).members
        finally:
            ensemble._members_in_turn = chosen

    # Agreement after 5 steps: further on, float32 rounding in another order grows along each member's
    # (chaotic) training path (3e-3 relative after 200 LeNet-5 steps), which says nothing about the programs.
    checks = {f"{name}: members in turn vs vectorised after 5 steps (rel err)":
              H.rel_err(train(True, 5), train(False, 5))}
    calls = {"in turn": lambda: train(True), "vectorised": lambda: train(False)}
    times, n_rounds = H.rounds(calls, min_rounds=cfg["rounds"], max_rounds=cfg["rounds"])
    med = H.medians(times)
    default = "in turn" if record["in turn"] else "vectorised"
    log(f"{name} ({P:,} parameters): in turn {med['in turn']:.2f} s, vectorised {med['vectorised']:.2f} s; "
        f"the default: {default}")
    return {"model": name, "num_params": int(P), "rounds": n_rounds, "median_s": med,
            "ratio vectorised / in turn": H.ratio(times, "vectorised", "in turn"), "default": default,
            "checks": checks}


def markdown(report):
    cfg, rows = report["config"], report["result"]
    lines = H.head("Deep ensembles: members in turn vs vectorised", report) + [
        f"`pst.deep_ensemble` with {cfg['members']} members, {cfg['steps']} Adam steps of {cfg['batch']} examples, "
        f"timed as called (each call compiles its training program: that is how it is used), {cfg['rounds']} "
        "interleaved rounds. *in turn*: `lax.map` over the members, each a `lax.scan` over its steps; "
        "*vectorised*: one `lax.scan` over the steps of the members `jax.vmap`ped.",
        *H.table(("model", "parameters", "in turn s", "vectorised s", "vectorised / in turn (median, IQR)",
                  "default"),
                 [(r["model"], f"{r['num_params']:,}", f"{r['median_s']['in turn']:.2f}",
                   f"{r['median_s']['vectorised']:.2f}", H.iqr(r["ratio vectorised / in turn"]), r["default"])
                  for r in rows], "lrrrrl"),
        *H.section("Checks (before timing)"),
        *H.table(("check", "value"), [(k, f"{v:.2e}") for r in rows for k, v in r["checks"].items()], "ll"),
    ]
    return H.render(lines + H.machine(report))


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    cfg = {"members": 2, "steps": 20, "batch": 32, "rounds": 1} if run.quick else \
        {"members": 5, "steps": 200, "batch": 128, "rounds": 2}
    rows = [run_model(name, cfg, log=run.log, quick=run.quick) for name in ("lenet5", "mlp")]
    for r in rows:
        for k, v in r["checks"].items():
            if not v <= 1e-4:
                raise SystemExit(f"{k} = {v:.2e}: the two programs disagree")
    run.write({"config": cfg, "summary": {r["model"]: r["ratio vectorised / in turn"]["median"] for r in rows},
               "result": rows}, markdown)


if __name__ == "__main__":
    main()
