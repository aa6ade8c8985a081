#!/usr/bin/env python
"""Data-parallel GGN products and projection sweeps on 1, 2, 4 and 8 devices: what the sharding costs.

``lo.GGNOp(..., mesh=mesh)`` splits the examples over the mesh (one ``psum`` of P numbers per product). Here
the devices are forced host devices (``--xla_force_host_platform_device_count=8``, set by this script
before JAX starts) sharing the machine's cores: the ideal time ratio to one device is 1, and the excess is
the sharding's overhead, not a speed-up. Projections (``from_jacobian(..., mesh=mesh)``) keep each batch's
factors where they were built and sweep sequentially or split; the script times one symmetric sweep each
way, counts the CG sweeps each needs, times sample-parallel projections, and estimates a GPU node from
flops and all-reduce sizes. Every product is checked against one device's first. See ``benchmarks/README.md``.

Run:  python benchmarks/scaling.py            # full run (a 784-128-128-10 MLP, N = 4,096)
      python benchmarks/scaling.py --quick    # smoke run (small model, few rounds; run in CI)
"""

from __future__ import annotations

import os

# 8 host devices, before JAX starts, added to XLA_FLAGS unless they already choose a device count
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import sys  # noqa: E402
import time  # noqa: E402

import _harness as H  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import linops as lo  # noqa: E402
from linops.likelihoods import Categorical  # noqa: E402
from linops.models import from_equinox, ravel  # noqa: E402


def problem(cfg):
    sizes = cfg["sizes"]
    model = eqx.nn.MLP(sizes[0], sizes[-1], sizes[1], len(sizes) - 2, activation=jnp.tanh, key=jax.random.key(0))
    fn, params = from_equinox(model)
    X = jax.random.normal(jax.random.key(1), (cfg["n"], sizes[0]))
    y = jax.random.randint(jax.random.key(2), (cfg["n"],), 0, sizes[-1])
    v = jax.random.normal(jax.random.key(3), (ravel(params)[0].shape[0],))
    return fn, params, X, y, v


def mesh_of(d):
    return None if d == 1 else Mesh(np.array(jax.devices()[:d]), ("data",))


def alternating(calls, rounds):
    """``rounds`` rounds over ``calls``, the order reversed every other round: ``{name: [seconds]}``."""
    return H.rounds(calls, min_rounds=rounds, max_rounds=rounds, reverse=True)[0]


def measure(cfg, log):
    fn, params, X, y, v = problem(cfg)
    devices = [d for d in cfg["devices"] if d <= jax.device_count()]
    calls, reference = {}, None
    for d in devices:
        G = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=cfg["batch"], mesh=mesh_of(d))
        f = jax.jit(lambda G, v: G @ v).lower(G, v).compile()
        out = f(G, v).block_until_ready()
        reference = out if reference is None else reference
        err = float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))
        if err > 1e-4:
            raise SystemExit(f"{d} devices: the sharded product differs from one device's by {err:.1e}")
        calls[d] = lambda f=f, G=G: f(G, v)
        log(f"  {d} device(s): compiled, relative difference to one device {err:.1e}")
    times = alternating(calls, cfg["rounds"])
    rows = {}
    for d in devices:
        r = H.ratio(times, d, 1)
        rows[d] = {"median_s": float(np.median(times[d])), "ratio_to_1": r["median"], "ratio_p25": r["p25"],
                   "ratio_p75": r["p75"], "examples_per_device": cfg["n"] // d}
    return {"num_params": int(v.shape[0]), "rows": rows}


def measure_projection(cfg, log):
    """Symmetric sweeps and whole projections on 1..8 devices, sequential and split, in float64: in float32
    CG stalls at a kernel residual of 1e-4 to 1e-3 (rounding), which would hide the convergence rates."""
    with jax.enable_x64(True):
        return _measure_projection(cfg, log)


def _measure_projection(cfg, log):
    pc = dict(cfg, **cfg["projection"])
    fn, params, X, _, x = problem(pc)
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, params)
    X, x = X.astype(jnp.float64), x.astype(jnp.float64)
    devices = [d for d in cfg["devices"] if d <= jax.device_count()]
    variants = [(1, False)] + [(d, split) for d in devices if d > 1 for split in (False, True)]
    calls, projections = {}, {}
    for d, split in variants:
        Pi = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=pc["batch"], mesh=mesh_of(d),
                                                      split_sweeps=split, max_sweeps=3000)
        Pi.symmetric_sweep(x).block_until_ready()  # compile
        t0 = time.perf_counter()
        result = Pi.project(x)
        result.value.block_until_ready()
        elapsed = time.perf_counter() - t0
        calls[d, split] = lambda Pi=Pi: Pi.symmetric_sweep(x)
        projections[d, split] = {"sweeps": int(result.sweeps), "converged": bool(result.converged),
                                 "kernel_residual": float(result.kernel_residual), "first_call_s": elapsed,
                                 "value": result.value}
        log(f"  projection on {d} device(s){' split' if split else ''}: {int(result.sweeps)} sweeps, "
            f"kernel residual {float(result.kernel_residual):.1e}")
    reference = projections[1, False]["value"]
    for key, row in projections.items():
        value = row.pop("value")
        row["difference_to_1"] = float(jnp.linalg.norm(value - reference) / jnp.linalg.norm(reference))
        if not key[1] and row["difference_to_1"] > 1e-6:
            raise SystemExit(f"{key[0]} devices: the sequential projection differs from one device's by "
                             f"{row['difference_to_1']:.1e}")
    times = alternating(calls, pc["rounds"])
    rows = []
    for (d, split) in variants:
        r, p = H.ratio(times, (d, split), (1, False)), projections[d, split]
        rows.append({"devices": d, "split": split, "sweep_s": float(np.median(times[d, split])),
                     "sweep_ratio_to_1": r["median"], "ratio_p25": r["p25"], "ratio_p75": r["p75"], **p,
                     "sweeps_ratio_to_1": p["sweeps"] / projections[1, False]["sweeps"]})
    samples = _measure_samples(pc, fn, params, X, devices, log)
    return {"num_params": int(x.shape[0]), "num_batches": -(-pc["n"] // pc["batch"]), "rows": rows,
            "samples": samples}


SAMPLE_STEPS = 40  # CG steps timed per block of samples (rtol 0: exactly this many, the same work everywhere)


def _measure_samples(pc, fn, params, X, devices, log):
    """A block of 8 samples projected sample-parallel (the columns travel round the devices, the factors
    stay), against one device's column-by-column CG: time for the same number of CG steps."""
    k = max(devices)
    V = jax.random.normal(jax.random.key(5), (ravel(params)[0].shape[0], k), jnp.float64)
    calls = {}
    for d in devices:
        Pi = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=pc["batch"], mesh=mesh_of(d),
                                                      max_sweeps=SAMPLE_STEPS, rtol=0.0)
        (Pi @ V).block_until_ready()  # compile
        calls[d] = lambda Pi=Pi: Pi @ V
    times = alternating(calls, max(2, pc["rounds"] // 3))
    out = [{"devices": d, "columns": k, "steps": SAMPLE_STEPS, "median_s": float(np.median(times[d])),
            "ratio_to_1": H.ratio(times, d, 1)["median"]} for d in devices]
    for row in out:
        log(f"  {k} samples on {row['devices']} device(s), {SAMPLE_STEPS} CG steps: {row['median_s']:.2f} s, "
            f"ratio {row['ratio_to_1']:.2f}")
    return out


def projection_gpu_estimate(P: int, N: int, batch: int, rows) -> list[dict]:
    """Time to a projection on D GPUs for a model of P weights and N examples in batches of ``batch``,
    from the sweep counts measured here (their ratios carry over; the absolute counts depend on the
    problem). A symmetric sweep costs about 8 N P flops (a tangent and a transposed product per batch,
    twice) plus a launch latency per batch step (2 N / batch steps); a split sweep divides both by D and
    adds a ring all-reduce of P float32 numbers. The sequential sweep on a mesh is left out: it moves
    every batch's factors to the vector in every sweep (3 to 8 times one device's time per sweep on the
    host devices above), so on a GPU node it is for memory, not speed."""
    one = next(r for r in rows if r["devices"] == 1)
    steps = 2 * -(-N // batch)
    sweep = 8 * N * P / GPU_FLOPS + steps * LAUNCH
    out = [{"devices": 1, "sweep_s": sweep, "projection_s": one["sweeps"] * sweep, "speedup": 1.0}]
    for r in rows:
        if r["split"]:
            d = r["devices"]
            per = sweep / d + 2 * (d - 1) / d * P * 4 / NVLINK + LATENCY
            out.append({"devices": d, "sweep_s": per, "projection_s": r["sweeps"] * per,
                        "speedup": one["sweeps"] * sweep / (r["sweeps"] * per)})
    return out


GPU_FLOPS = 15e12  # sustained float32 FLOP/s assumed for one data-centre GPU on these small matmuls
NVLINK = 300e9  # all-reduce bandwidth, bytes/s
LATENCY = 20e-6  # per all-reduce, s
LAUNCH = 5e-6  # per batch step of a sweep (kernel launches of a small scan body), s


def gpu_estimate(P: int, N: int, devices=(1, 2, 4, 8)) -> list[dict]:
    """Time per GGN product on D GPUs: about 8 N P flops (forward, JVP and two reverse passes of an MLP)
    split evenly, at GPU_FLOPS each, plus a ring all-reduce of P float32 numbers
    (2 (D - 1) / D P 4 bytes at NVLINK, plus LATENCY)."""
    out = []
    for d in devices:
        compute = 8 * N * P / GPU_FLOPS / d
        comm = 0.0 if d == 1 else 2 * (d - 1) / d * P * 4 / NVLINK + LATENCY
        out.append({"devices": d, "compute_s": compute, "allreduce_s": comm, "efficiency": compute / (compute + comm)})
    return out


def markdown(report) -> str:
    cfg, res = report["config"], report["result"]
    lines = H.head("Data-parallel GGN products", report) + [
             f"Model: {'-'.join(map(str, cfg['sizes']))} tanh MLP (P = {res['num_params']:,}), N = {cfg['n']:,} "
             f"examples, batch {cfg['batch']} per device, categorical likelihood, float32; "
             f"{report['machine'].get('cpu_model') or 'CPU'}, {report['machine'].get('cpus_usable')} cores, "
             "forced host devices sharing them.", "",
             *H.table(("devices", "examples per device", "median time per product", "time / one device's (IQR)"),
                      [(d, f"{r['examples_per_device']:,}", f"{r['median_s'] * 1e3:.1f} ms",
                        f"{r['ratio_to_1']:.2f} ({r['ratio_p25']:.2f}–{r['ratio_p75']:.2f})")
                       for d, r in res["rows"].items()], "rrrr")]
    lines += ["", "The host devices share the same cores, so the ideal ratio is 1.00 and the excess is the cost "
              "of splitting the data, the per-device programs and the `psum`. Every sharded product equals the "
              "single-device one (checked before timing; the `distributed` tests check the operators and the "
              "posteriors to 1e-10 in float64).", "",
              "**Estimate for a GPU node** (not measured: no GPU here). A GGN product of an MLP costs about 8 N P "
              f"flops (forward, JVP and two reverse passes); at an assumed sustained {GPU_FLOPS / 1e12:.0f} TFLOP/s "
              "per GPU, split evenly over D GPUs, plus a ring all-reduce of P float32 numbers (NVLink at "
              f"{NVLINK / 1e9:.0f} GB/s, {LATENCY * 1e6:.0f} µs latency):", "",
              *H.table(("GPUs", "compute", "all-reduce", "efficiency"),
                       [(e["devices"], f"{e['compute_s'] * 1e6:.0f} µs", f"{e['allreduce_s'] * 1e6:.0f} µs",
                         f"{e['efficiency']:.2f}") for e in report["gpu_estimate"]], "rrrr")]
    lines += ["", "Efficiency is compute / (compute + all-reduce): the all-reduce of P numbers is fixed while the "
              "compute shrinks with D, so a larger N per device keeps it high. The measured CPU ratios above say "
              "nothing about this (the forced host devices share two cores); they bound the overhead of the "
              "sharded program itself.", ""]
    proj = report.get("projection")
    if proj:
        pc = cfg["projection"]
        lines += [*H.section("Projection sweeps"),
                  f"Model: {'-'.join(map(str, pc['sizes']))} tanh MLP (P = {proj['num_params']:,}), "
                  f"N = {pc['n']:,}, {proj['num_batches']} batches of {pc['batch']} examples "
                  f"({pc['batch'] * pc['sizes'][-1]} rows), CG to the default tolerance, float64 (in float32 CG "
                  "stalls at the rounding floor, a kernel residual of 1e-4 to 1e-3, and the rates below would not "
                  "show). Each batch's factors stay on the device that built them. "
                  "*Sequential*: the sweep is one device's product Q_1 ⋯ Q_B ⋯ Q_1 (XLA moves each batch's "
                  "factors to the vector). *Split*: each device sweeps its own batches and the results are "
                  "averaged (one `psum` per sweep).", "",
                  *H.table(("devices", "sweep", "time per sweep / one device's (IQR)", "CG sweeps",
                            "sweeps / one device's", "kernel residual", "difference to one device"),
                           [(r["devices"], "split" if r["split"] else "sequential",
                             f"{r['sweep_ratio_to_1']:.2f} ({r['ratio_p25']:.2f}–{r['ratio_p75']:.2f})",
                             f"{r['sweeps']}{'' if r['converged'] else ' (not converged)'}",
                             f"{r['sweeps_ratio_to_1']:.2f}", f"{r['kernel_residual']:.1e}",
                             f"{r['difference_to_1']:.1e}") for r in proj["rows"]], "rlrrrrr"),
                  "", f"**Sample-parallel projections** ({proj['samples'][0]['columns']} samples, "
                  f"{proj['samples'][0]['steps']} CG steps each way): one device runs the columns' CGs side by "
                  "side; on D devices each takes its share of the columns, which travel round the devices "
                  "(`ppermute`) while every batch's factors stay where they were built.", "",
                  *H.table(("devices", "time", "time / one device's"), [
                      (r["devices"], f"{r['median_s']:.2f} s", f"{r['ratio_to_1']:.2f}") for r in proj["samples"]],
                           "rrr"),
                  "", "A product of projectors depends on the order of its factors, and the average of D shorter "
                  "products contracts less than the full product: the split sweep needs more CG sweeps to the same "
                  "tolerance (the *sweeps* column) and pays that back only if each sweep is more than that much "
                  "faster, i.e. on D real devices. The sequential sweep gives the single-device result on any mesh "
                  "(last column); the split one converges to the same projector (the `distributed` tests check "
                  "both against the exact projector).", "",
                  "**Estimate for a GPU node**, for the model of the first part (P = "
                  f"{res['num_params']:,}, N = {cfg['n']:,}, batches of {pc['batch']}) with the sweep counts "
                  "measured here (their ratios carry over, not the counts): a symmetric sweep costs about 8 N P "
                  f"flops at {GPU_FLOPS / 1e12:.0f} TFLOP/s plus {LAUNCH * 1e6:.0f} µs per batch step; a split "
                  "sweep divides both by D and adds an all-reduce of P numbers. Not measured: no GPU here.", "",
                  *H.table(("GPUs", "time per sweep", "time to the projection", "speed-up over one GPU"),
                           [(f"{e['devices']}{'' if e['devices'] == 1 else ' (split)'}", f"{e['sweep_s'] * 1e6:.0f} µs",
                             f"{e['projection_s'] * 1e3:.1f} ms", f"{e['speedup']:.2f}")
                            for e in report["projection_gpu_estimate"]], "rrrr"),
                  "", "The sequential sweep on a mesh is not in this table: it moves every batch's factors to the "
                  "vector in every sweep (the CPU rows above: 3 to 8 times one device's time per sweep). It keeps "
                  "the factors' memory split over the devices and gives exactly the single-device result; for speed, "
                  "split the sweeps, or project blocks of samples sample-parallel (`Pi @ V` on the mesh, "
                  "`post.sample`: the vectors move, the factors stay)."]
        lines.append("")
    return H.render(lines)


def main(argv=None):
    run = H.Run(__file__, __doc__, argv)
    cfg = {"sizes": (32, 32, 10), "n": 512, "batch": 32, "rounds": 3, "devices": (1, 2, 4, 8),
           "projection": {"sizes": (8, 32, 4), "n": 48, "batch": 4, "rounds": 3}} if run.quick else {
        "sizes": (784, 128, 128, 10), "n": 4096, "batch": 128, "rounds": 40, "devices": (1, 2, 4, 8),
        "projection": {"sizes": (64, 64, 64, 10), "n": 512, "batch": 16, "rounds": 10}}
    if jax.device_count() < 2:
        run.log("scaling.py: only one device (XLA_FLAGS chose one device count before this script); nothing to compare")
        return 0
    result = measure(cfg, run.log)
    projection = measure_projection(cfg, run.log)
    run.write({"config": cfg, "result": result, "gpu_estimate": gpu_estimate(result["num_params"], cfg["n"]),
               "projection": projection, "projection_gpu_estimate": projection_gpu_estimate(
                   result["num_params"], cfg["n"], cfg["projection"]["batch"], projection["rows"])}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
