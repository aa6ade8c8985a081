#!/usr/bin/env python
"""The memory table of ``docs/howto/memory.md``, measured: each posterior of a 118k-parameter MLP (784-128-128-10,
tanh, weights at initialisation) on N MNIST digits (``posteriors.data.mnist``, 10 classes, float32).

Each posterior runs in its own child process (spawned): its fit once (compile; the result kept alive), then again,
measured. Reported per posterior: the peak resident memory of the second fit above the process's resident memory
just before it (``VmHWM`` reset through ``/proc/self/clear_refs``: every allocation, XLA's workspace included),
and what the posterior keeps (the bytes of its array leaves other than the network's own parameters and the data). Full
Laplace is not run: its refusal (``MemoryBudgetError``, before any work) is what the table shows.

Run:  python benchmarks/memory.py            # N = 1,000 (a few minutes on 2 cores)
      python benchmarks/memory.py --quick    # N = 100 (smoke run, not to be read)
"""

from __future__ import annotations

import multiprocessing

import _harness as H

SIZES = (784, 128, 128, 10)
CASES = ("diag", "kfac", "lowrank", "last_layer", "subnetwork", "projected", "projected_recompute", "projected_lenet")
DESCRIBE = {
    "diag": 'pst.laplace(structure="diag")',
    "kfac": 'pst.laplace(structure="kfac")',
    "lowrank": 'pst.laplace(structure="lowrank", rank=20)',
    "last_layer": 'pst.laplace(structure="full", subset_of_weights="last_layer")',
    "subnetwork": "pst.subnetwork_laplace, S = 2,000 largest-magnitude weights",
    "projected": "pst.projected_posterior(batch_size=10) (stores what makes sweeps cheapest, if it fits)",
    "projected_recompute": "pst.projected_posterior(batch_size=10, store_linearization=False)",
    "projected_lenet": "the same on LeNet-5 (244k parameters), N / 4 digits",
}


def _child(case, n, queue):
    try:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import numpy as np
        from _processes import PeakRSS

        import posteriors as pst
        from linops.likelihoods import Categorical
        from linops.models import from_equinox, ravel

        images, labels = pst.data.mnist()
        order = np.random.default_rng(0).permutation(images.shape[0])[:n]
        X = jnp.asarray(images[order].reshape(n, -1))
        y = jnp.asarray(labels[order])
        fn, params = from_equinox(eqx.nn.MLP(784, 10, 128, 2, activation=jnp.tanh, key=jax.random.key(0)))
        if case == "projected_lenet":  # a CNN: its rows are cheaper than tangent passes, so they are stored
            from posteriors.experiments.architectures import lenet5

            fn, params = lenet5(jax.random.key(0))
            n = n // 4
            X = jnp.asarray(images[order][:n])[:, None]  # (n, 1, 28, 28): channels first
            y = y[:n]
        P = int(ravel(params)[0].shape[0])

        def fit():
            data, lik = (X, y), Categorical()
            if case == "lowrank":
                return pst.laplace(fn, params, data, lik, structure="lowrank", rank=20, key=jax.random.key(1),
                                   batch_size=100, progress=False)
            if case == "last_layer":
                return pst.laplace(fn, params, data, lik, subset_of_weights="last_layer", batch_size=100,
                                   progress=False)
            if case == "subnetwork":
                sub = pst.subnetwork.largest_magnitude(params, 2000)
                return pst.subnetwork_laplace(fn, params, data, lik, sub, batch_size=100, progress=False)
            if case.startswith("projected"):
                options = {"store_linearization": False} if case == "projected_recompute" else {}
                return pst.projected_posterior(fn, params, X, batch_size=10, prior_precision=1.0, progress=False,
                                               **options)
            return pst.laplace(fn, params, data, lik, structure=case, batch_size=100, progress=False)

        first = jax.block_until_ready(fit())  # compiled and run once; kept alive, so that the measured fit's
        post, seconds, peak = PeakRSS().call(fit)  # arrays cannot reuse its freed pages
        del first
        own = {id(a) for a in jax.tree_util.tree_leaves((params, X, y))}
        kept = sum(int(a.nbytes) for a in jax.tree_util.tree_leaves(post)
                   if hasattr(a, "nbytes") and id(a) not in own)
        extra = {}
        if case.startswith("projected"):
            extra["storage"] = post.projection.blocks.storage
        queue.put({"case": case, "P": P, "N": n, "seconds": seconds, "peak_bytes": peak, "kept_bytes": kept,
                   **extra})
    except Exception as e:  # reported, not raised: the table says what failed
        queue.put({"case": case, "error": f"{type(e).__name__}: {e}"[:400]})


def _full_refusal(n):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import posteriors as pst
    from linops.likelihoods import Categorical
    from linops.memory import MemoryBudgetError
    from linops.models import from_equinox

    fn, params = from_equinox(eqx.nn.MLP(784, 10, 128, 2, activation=jnp.tanh, key=jax.random.key(0)))
    X, y = jnp.zeros((n, 784)), jnp.zeros(n, jnp.int32)
    try:
        pst.laplace(fn, params, (X, y), Categorical(), progress=False)
    except MemoryBudgetError as e:
        return str(e).split(";")[0]
    return "not refused on this machine (it has the memory)"


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    n = 100 if run.quick else 1000
    context = multiprocessing.get_context("spawn")
    rows = []
    for case in CASES:
        queue = context.Queue()
        child = context.Process(target=_child, args=(case, n, queue))
        child.start()
        result = queue.get()
        child.join()
        run.log(f"{case}: {result}")
        rows.append(result)
    report = {"N": n, "sizes": SIZES, "rows": rows, "full": _full_refusal(n)}

    def markdown(r):
        mb = lambda b: "–" if b is None else f"{b / 1e6:,.1f}"  # noqa: E731
        table = "\n".join(H.table(["posterior", "peak MB (second fit)", "kept MB", "seconds", "notes"],
                        [[DESCRIBE[x["case"]], mb(x.get("peak_bytes")), mb(x.get("kept_bytes")),
                          f"{x['seconds']:.2f}" if "seconds" in x else "–",
                          x.get("error") or (f"storage: {x['storage']}" if "storage" in x else "")]
                         for x in r["rows"]]))
        return (f"# Memory of each posterior (118k-parameter MLP, N = {r['N']:,} MNIST digits, 10 classes)\n\n"
                f"Command: `{r['command']}`\n\n{table}\n\nFull Laplace: {r['full']}.\n")

    run.write(report, markdown)


if __name__ == "__main__":
    main()
