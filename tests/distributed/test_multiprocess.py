"""Two processes joined with `jax.distributed` compute a sharded GGN product (localhost CPU smoke test).

    pytest -m distributed -n 0 tests/distributed/test_multiprocess.py

The test launches two worker processes (``sys.executable``), each with two forced host CPU devices,
joined with ``jax.distributed.initialize`` on a free localhost port. Each worker builds a
`jax.sharding.Mesh` over all four global devices and computes ``GGNOp(..., mesh=mesh) @ v``:

* with host numpy inputs identical on both processes, passed as they are (N = 53: the uneven
  remainder is summed on its own, replicated), eagerly and under ``jax.jit``;
* with global inputs assembled from each process's own half of the examples
  (``jax.make_array_from_process_local_data``), the multi-host data-parallel case.

Each worker reads the replicated output back with ``out.addressable_data(0)`` and saves it; the test
compares both workers' results with the single-process, no-mesh product computed here. A ``psum``
over process-local data checks first that the reduction really crosses the processes: the test is
skipped only if the CPU backend says it cannot run multi-process computations.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical
from linops.models import from_equinox, ravel

from ..linops._util import assert_close

pytestmark = pytest.mark.distributed

N = 53  # not a multiple of the 4 global devices: the replicated remainder is exercised
EVEN = 52  # examples split evenly, 26 held by each process, for the global-input case
PROCESSES, LOCAL_DEVICES = 2, 2
SKIP = 77  # a worker's exit status: this platform cannot run cross-process CPU collectives
REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import json, sys, time

    import jax

    port, pid, workdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    start = time.perf_counter()
    jax.config.update("jax_enable_x64", True)  # the worker's own setting, as the test session's
    try:  # the default on recent jax; older ones have no cross-process CPU collectives without it
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError):
        pass
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                               initialization_timeout=60)

    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import linops as lo
    from linops.likelihoods import Categorical
    from linops.models import from_equinox, ravel

    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = Mesh(np.array(jax.devices()), ("data",))
    split = NamedSharding(mesh, PartitionSpec("data"))

    def read(out):
        # replicated over all four devices: every process holds a full copy
        assert out.sharding.is_fully_replicated, out.sharding
        return np.asarray(out.addressable_data(0))

    # the reduction must cross the processes: each one holds only its own two numbers
    local = np.arange(2.0 * pid, 2.0 * pid + 2.0)
    probe = jax.make_array_from_process_local_data(split, local)
    try:
        total = jax.shard_map(lambda b: jax.lax.psum(b.sum(), "data"), mesh=mesh,
                              in_specs=PartitionSpec("data"), out_specs=PartitionSpec())(probe)
        total = float(read(total))
    except Exception as e:  # noqa: BLE001
        if "Multiprocess computations aren't implemented" in str(e):
            print(json.dumps({"skip": str(e)}), flush=True)
            sys.exit(77)
        raise

    data = np.load(f"{workdir}/inputs.npz")
    X, y, v = data["X"], data["y"], data["v"]
    fn, params = from_equinox(eqx.nn.MLP(3, 2, 6, 2, activation=jnp.tanh, key=jax.random.key(0)))
    params = ravel(params)[1](jnp.asarray(data["params"]))
    lik = Categorical()

    # host numpy inputs, the same on both processes, passed as they are
    G = lo.GGNOp(fn, params, X, y, lik, batch_size=4, mesh=mesh)
    host_eager = read(G @ v)
    host_jit = read(jax.jit(lambda G, v: G @ v)(G, v))

    # global inputs assembled from each process's own half of the first 52 examples
    half = slice(pid * 26, (pid + 1) * 26)
    Xg = jax.make_array_from_process_local_data(split, X[half])
    yg = jax.make_array_from_process_local_data(split, y[half])
    assert Xg.shape == (52, 3) and not Xg.is_fully_addressable
    G = lo.GGNOp(fn, params, Xg, yg, lik, batch_size=4, mesh=mesh)
    global_jit = read(jax.jit(lambda G, v: G @ v)(G, v))

    np.savez(f"{workdir}/out{pid}.npz", total=total, host_eager=host_eager, host_jit=host_jit,
             global_jit=global_jit)
    jax.distributed.shutdown()
    print(json.dumps({"process": pid, "seconds": time.perf_counter() - start}), flush=True)
    """
)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem():
    fn, params = from_equinox(eqx.nn.MLP(3, 2, 6, 2, activation=jnp.tanh, key=jax.random.key(0)))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 3))
    y = rng.integers(0, 2, size=(N,))
    v = rng.normal(size=(ravel(params)[0].shape[0],))
    return fn, params, X, y, v


def _launch(workdir):
    try:
        port = _free_port()
    except OSError as e:
        pytest.skip(f"cannot bind a localhost port for the coordinator: {e}")
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    script = workdir / "worker.py"
    script.write_text(WORKER)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(port), str(i), str(workdir)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(PROCESSES)
    ]
    outputs = []
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        pytest.fail("the workers took more than 120 s:\n" + "\n".join(f"--- worker {i}\n{log[-3000:]}"
                                                                    for i, log in enumerate(logs)))
    return [p.returncode for p in procs], outputs


def test_two_processes_compute_the_sharded_ggn_product_of_one(tmp_path):
    fn, params, X, y, v = _problem()
    np.savez(tmp_path / "inputs.npz", X=X, y=y, v=v, params=np.asarray(ravel(params)[0]))
    codes, logs = _launch(tmp_path)
    report = "\n".join(f"--- worker {i} (exit {c})\n{log[-3000:]}" for i, (c, log) in
                       enumerate(zip(codes, logs, strict=True)))
    if SKIP in codes:
        reason = next(json.loads(line)["skip"] for log in logs for line in log.splitlines()
                      if line.startswith('{"skip"'))
        pytest.skip(f"no cross-process collectives on the CPU backend here: {reason}")
    assert codes == [0, 0], report
    outs = [np.load(tmp_path / f"out{i}.npz") for i in range(PROCESSES)]

    one = lo.GGNOp(fn, params, X, y, Categorical(), batch_size=4) @ v
    first = lo.GGNOp(fn, params, X[:EVEN], y[:EVEN], Categorical(), batch_size=4) @ v
    for i, out in enumerate(outs):
        assert float(out["total"]) == 0.0 + 1.0 + 2.0 + 3.0, f"worker {i}: psum did not cross processes\n{report}"
        assert_close(out["host_eager"], one, rtol=1e-10, err_msg=f"worker {i}, host inputs, eager")
        assert_close(out["host_jit"], one, rtol=1e-10, err_msg=f"worker {i}, host inputs, jit")
        assert_close(out["global_jit"], first, rtol=1e-10, err_msg=f"worker {i}, global inputs, jit")
