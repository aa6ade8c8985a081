"""Sharded operators against the single-device result (run with several devices, see the marker).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 pytest -m distributed -n 0

The examples are split over a one-axis mesh; N = 53 is not a multiple of the device count, so the
uneven remainder (summed on its own, replicated) is exercised every time, and batch_size = 4 leaves a
short last batch on each device.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import linops as lo
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel
from tests import _draws as draws
from tests.posteriors._shared import axes

from ..linops._util import assert_close

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(jax.device_count() < 2, reason="needs several devices (XLA_FLAGS=...device_count=8)"),
]
N = 53


def _mesh(devices=None):
    devices = jax.devices() if devices is None else devices
    return Mesh(np.array(devices), ("data",))


def _problem(likelihood):
    fn, params = from_equinox(eqx.nn.MLP(3, 2, 6, 2, activation=jnp.tanh, key=jax.random.key(0)))
    X = draws.normal(jax.random.key(1), (N, 3))
    if isinstance(likelihood, Categorical):
        y = jax.random.randint(jax.random.key(2), (N,), 0, 2)
    else:
        y = draws.normal(jax.random.key(2), (N, 2))
    v = draws.normal(jax.random.key(3), (ravel(params)[0].shape[0],))
    return fn, params, X, y, v


@pytest.mark.parametrize("likelihood", [Categorical(), Gaussian(0.5)], ids=["categorical", "gaussian"])
@pytest.mark.parametrize("devices", [2, 8])
def test_ggn_products_diag_and_matrix_match_one_device(likelihood, devices):
    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    fn, params, X, y, v = _problem(likelihood)
    one = lo.GGNOp(fn, params, X, y, likelihood, batch_size=4)
    many = lo.GGNOp(fn, params, X, y, likelihood, batch_size=4, mesh=_mesh(jax.devices()[:devices]))
    assert_close(many @ v, one @ v, rtol=1e-10)
    assert_close(jax.jit(lambda G, v: G @ v)(many, v), one @ v, rtol=1e-10)
    V = jnp.stack([v, 2 * v + 1], axis=1)
    assert_close(many.mm(V), one.mm(V), rtol=1e-10)
    assert_close(lo.diag(many), lo.diag(one), rtol=1e-10)
    assert_close(many.as_matrix(), one.as_matrix(), rtol=1e-10)


def test_hessian_and_monte_carlo_fisher_on_a_mesh_match_one_device():
    """The curvatures beyond the GGN split like it: a HessianOp's products, and a Monte-Carlo Fisher, whose draws
    belong to the examples (their keys travel with the targets), not to the devices."""
    from linops.likelihoods import MonteCarloFisher

    fn, params, X, y, v = _problem(Categorical())
    mesh = _mesh()
    H1 = lo.HessianOp(fn, params, X, y, Categorical(), batch_size=4)
    H8 = lo.HessianOp(fn, params, X, y, Categorical(), batch_size=4, mesh=mesh)
    assert_close(H8 @ v, H1 @ v, rtol=1e-10)
    mc = MonteCarloFisher(Categorical(), num_samples=2)
    T = mc.with_keys(y, jax.random.key(6))
    F1 = lo.GGNOp(fn, params, X, T, mc, batch_size=4)
    F8 = lo.GGNOp(fn, params, X, T, mc, batch_size=4, mesh=mesh)
    assert_close(F8 @ v, F1 @ v, rtol=1e-10)


def test_jacobian_and_loss_jacobian_match_one_device():
    fn, params, X, y, v = _problem(Categorical())
    mesh = _mesh()
    J1, J8 = lo.JacobianOp(fn, params, X, batch_size=4), lo.JacobianOp(fn, params, X, batch_size=4, mesh=mesh)
    u = draws.normal(jax.random.key(4), (J1.shape[0],))
    assert_close(J8 @ v, J1 @ v, rtol=1e-10)
    assert_close(J8.T @ u, J1.T @ u, rtol=1e-10)
    L1 = lo.LossJacobianOp(fn, params, X, y, Categorical(), batch_size=4)
    L8 = lo.LossJacobianOp(fn, params, X, y, Categorical(), batch_size=4, mesh=mesh)
    w = draws.normal(jax.random.key(5), (N,))
    assert_close(L8 @ v, L1 @ v, rtol=1e-10)
    assert_close(L8.T @ w, L1.T @ w, rtol=1e-10)
    # the congruence built from sharded parts is the GGN, and is still tagged psd
    G = J8.T @ J8
    assert {"psd", "symmetric"} <= set(G.tags)
    assert_close(G @ v, J1.T @ (J1 @ v), rtol=1e-10)


def test_inputs_already_sharded_and_gradients_through_the_product():
    fn, params, X, y, v = _problem(Gaussian(1.0))
    mesh = _mesh()
    even = (N // jax.device_count()) * jax.device_count()
    Xs = jax.device_put(X[:even], NamedSharding(mesh, PartitionSpec("data")))
    ys = jax.device_put(y[:even], NamedSharding(mesh, PartitionSpec("data")))
    one = lo.GGNOp(fn, params, X[:even], y[:even], Gaussian(1.0))
    many = lo.GGNOp(fn, params, Xs, ys, Gaussian(1.0), mesh=mesh)
    assert_close(many @ v, one @ v, rtol=1e-10)
    # reverse mode through a sharded product: d/dv of v^T G v is 2 G v
    grad = jax.grad(lambda v: v @ (many @ v))(v)
    assert_close(grad, 2 * (one @ v), rtol=1e-10)


def test_a_mesh_without_the_example_axis_is_refused():
    fn, params, X, y, _ = _problem(Gaussian(1.0))
    mesh = Mesh(np.array(jax.devices()), ("model",))
    with pytest.raises(ValueError, match="the example axis 'data' is not one of them"):
        lo.GGNOp(fn, params, X, y, Gaussian(1.0), mesh=mesh)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        lo.JacobianOp(fn, params, X, mesh="data")


@pytest.mark.parametrize("structure", ["full", "diag", "last_layer", "lowrank", "kfac"])
def test_laplace_posteriors_on_a_mesh_equal_one_device(structure):
    import posteriors as pst

    fn, params, X, y, _ = _problem(Categorical())
    options = dict(**axes(structure), batch_size=4, prior_precision=0.5)
    if structure == "lowrank":
        options.update(rank=5, key=jax.random.key(6))
    one = pst.laplace(fn, params, (X, y), Categorical(), **options)
    many = pst.laplace(fn, params, (X, y), Categorical(), mesh=_mesh(), **options)
    assert_close(many.covariance.as_matrix(), one.covariance.as_matrix(), rtol=1e-8, atol=1e-10)
    assert_close(pst.marginal_log_likelihood(many), pst.marginal_log_likelihood(one), rtol=1e-10)
    assert_close(pst.predictive.linearized(many, X[:5])[1], pst.predictive.linearized(one, X[:5])[1], rtol=1e-8)


def test_kfac_factors_on_a_mesh_equal_one_device():
    fn, params, X, y, _ = _problem(Categorical())
    one = lo.kfac(fn, params, X, y, Categorical(), batch_size=4)
    many = lo.kfac(fn, params, X, y, Categorical(), batch_size=4, mesh=_mesh())
    for (a1, b1), (a8, b8) in zip(one.factors, many.factors, strict=True):
        assert_close(a8, a1, rtol=1e-10)
        assert_close(b8, b1, rtol=1e-10)
    for c1, c8 in zip(one.bias_blocks, many.bias_blocks, strict=True):
        assert_close(c8, c1, rtol=1e-10)


def test_sample_parallel_projections_and_trace_probes_equal_one_device():
    import posteriors as pst

    fn, params, X, _, _ = _problem(Gaussian(1.0))
    mesh = _mesh()
    post = pst.projected_posterior(fn, params, X[:20], batch_size=4, prior_precision=2.0)  # 40 rows, 80 weights
    key = jax.random.key(7)
    # 19 samples: two per device and three left over (applied on their own). CG stops per device, so the
    # results agree to the projection's accuracy, not bit for bit; both are checked against the exact projector.
    J = lo.JacobianOp(fn, params, X[:20]).as_matrix()
    exact = lo.ProjectorOp.onto_null_space(J)
    many, one = post.sample(key, 19, mesh=mesh), post.sample(key, 19)
    eps = draws.normal(key, (post.mean.shape[0], 19))
    assert_close(many, one, atol=1e-5)
    assert_close(many, post.mean[None, :] + (exact @ eps).T / jnp.sqrt(2.0), atol=1e-5)
    Pi = post.projection
    V = draws.normal(jax.random.key(8), (Pi.shape[0], 16))
    assert_close(lo.sharded_mm(Pi, V, mesh), exact @ V, atol=1e-5)
    one = lo.hutchinson(Pi, jax.random.key(9), 24)
    many = lo.hutchinson(Pi, jax.random.key(9), 24, mesh=mesh)
    assert_close(many.value, one.value, rtol=1e-5)
    assert_close(many.standard_error, one.standard_error, rtol=1e-4)
    with pytest.raises(ValueError, match="needs V of shape"):
        lo.sharded_mm(Pi, V[:-1], mesh)


@pytest.mark.parametrize("devices", [3, 8])
@pytest.mark.parametrize("multi", [False, True], ids=["one_output", "coregionalized"])
def test_kernel_gram_row_tiles_on_a_mesh_equal_one_device(devices, multi):
    from linops.kernels import RBF, Coregionalized, KernelGramOp

    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    mesh = _mesh(jax.devices()[:devices])
    kernel = RBF(lengthscale=0.7)
    if multi:
        kernel = Coregionalized(kernel, jnp.array([[1.0, 0.3], [0.3, 0.5]]))
    X = draws.normal(jax.random.key(10), (N, 2))
    X2 = draws.normal(jax.random.key(11), (17, 2))
    # block_size 4: 14 tiles, which 3 and 8 devices do not divide (padding tiles are computed, then dropped)
    for columns in (None, X2):
        one = KernelGramOp(kernel, X, columns, block_size=4)
        many = KernelGramOp(kernel, X, columns, block_size=4, mesh=mesh)
        V = draws.normal(jax.random.key(12), (one.shape[1], 3))
        U = draws.normal(jax.random.key(13), (one.shape[0], 3))
        assert_close(many.mm(V), one.mm(V), rtol=1e-10)
        assert_close(many.T.mm(U), one.T.mm(U), rtol=1e-10)
        assert_close(many.as_matrix(), one.as_matrix(), rtol=1e-10)
        assert_close(many.as_matrix(), kernel(X, columns) if columns is not None else kernel(X), rtol=1e-10)
    # reverse mode w.r.t. the kernel's hyperparameters through the sharded tiles
    v = draws.normal(jax.random.key(14), (one.shape[0],))

    def quad(k, mesh):
        return v @ (KernelGramOp(k, X, block_size=4, mesh=mesh) @ v)

    g1, g8 = jax.grad(quad)(kernel, None), jax.grad(quad)(kernel, mesh)
    for a, b in zip(jax.tree_util.tree_leaves(g8), jax.tree_util.tree_leaves(g1), strict=True):
        assert_close(a, b, rtol=1e-9)


def _exact_projection(fn, params, X):
    return lo.ProjectorOp.onto_null_space(lo.JacobianOp(fn, params, X).as_matrix())


@pytest.mark.parametrize("devices,store", [(2, True), (4, True), (4, "rows")])
def test_projection_factors_live_on_the_devices_holding_their_batches(devices, store):
    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    fn, params, X, _, v = _problem(Gaussian(1.0))
    X = X[:20]  # 5 batches of 4: 40 rows, 80 weights; 5 batches do not split evenly over 2 or 4 devices
    mesh = _mesh(jax.devices()[:devices])
    one = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, store_linearization=store)
    many = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, mesh=mesh, store_linearization=store)
    assert many.storage == ("rows" if store == "rows" else "linearization") and len(many.stored) > 0
    # the batch axis is split: each device holds the factors (and linearisations or rows) of its own batches only
    batches = -(-5 // devices) * devices
    assert many.W.shape[0] == batches and many.W.sharding.spec == PartitionSpec("data")
    assert {s.data.shape[0] for s in many.W.addressable_shards} == {batches // devices}
    for leaf in jax.tree_util.tree_leaves(many.stored):
        assert {s.data.shape[0] for s in leaf.addressable_shards} == {batches // devices}
    # the factors of a batch are the ones one device computes (the padding repeats the last batch)
    idx = np.minimum(np.arange(batches), 4)
    assert_close(many.W, one.W[idx], rtol=1e-10, atol=1e-12)
    exact = _exact_projection(fn, params, X)
    r1, r8 = one.project(v), many.project(v)
    assert bool(r8.converged)
    assert_close(r8.value, exact @ v, atol=1e-5)
    assert_close(r8.value, r1.value, atol=1e-5)


@pytest.mark.parametrize("devices", [2, 4])
def test_split_sweeps_converge_to_the_same_projection(devices):
    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    fn, params, X, _, v = _problem(Gaussian(1.0))
    # 5 batches of 2 examples (20 rows for 80 weights): they do not split evenly over 2 or 4 devices. The 40-row
    # problem of the test above is too ill-conditioned for the averaged sweep: on 4 devices (pairs of batches)
    # I - T has eigenvalues down to 6.7e-8 (condition 1.5e7), CG levels off at a relative residual of 1.5e-9 and
    # stops unconverged (reported as such), 1.5e-2 from the projection; here the condition is 3.7e4-6.5e4.
    X = X[:10]
    mesh = _mesh(jax.devices()[:devices])
    exact = _exact_projection(fn, params, X)
    one = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=2).project(v)
    split = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=2, mesh=mesh, split_sweeps=True,
                                                     store_linearization=True)
    on_rows = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=2, mesh=mesh, split_sweeps=True,
                                                       store_linearization="rows")
    assert on_rows.storage == "rows"
    assert_close(on_rows.symmetric_sweep(v), split.symmetric_sweep(v), atol=1e-12)
    r = split.project(v)
    assert bool(r.converged)
    assert_close(r.value, exact @ v, atol=1e-7)
    r_rows = on_rows.project(v)
    assert bool(r_rows.converged)
    assert_close(r_rows.value, exact @ v, atol=1e-7)
    # the averaged sweep contracts less than the full product: more sweeps for the same tolerance
    assert int(r.sweeps) > int(one.sweeps)
    # the averaged symmetric sweep is symmetric, and fixes the kernel exactly
    u = draws.normal(jax.random.key(20), v.shape)
    assert_close(u @ split.symmetric_sweep(v), v @ split.symmetric_sweep(u), rtol=1e-10)
    assert_close(split.symmetric_sweep(exact @ v), exact @ v, atol=1e-10)
    # the plain method on split sweeps is the averaged product of each device's batches
    plain = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=2, mesh=mesh, split_sweeps=True,
                                                     method="plain")
    Q = [lo.ProjectorOp.onto_null_space(lo.JacobianOp(fn, params, X[2 * b: 2 * b + 2]).as_matrix()) for b in range(5)]
    per_device = -(-5 // devices)
    idx = np.minimum(np.arange(per_device * devices), 4).reshape(devices, per_device)
    expected = 0.0
    for batches in idx:
        w = v
        for b in batches:
            w = Q[b] @ w
        expected = expected + w / devices
    assert_close(plain.sweep(v), expected, atol=1e-8)


def test_split_sweeps_and_bad_options_are_refused():
    fn, params, X, _, _ = _problem(Gaussian(1.0))
    with pytest.raises(ValueError, match="split_sweeps=True splits the batch sequence .* pass mesh="):
        lo.AlternatingProjectionOp.from_jacobian(fn, params, X[:8], batch_size=4, split_sweeps=True)
    with pytest.raises(ValueError, match="the example axis 'data' is not one of them"):
        lo.AlternatingProjectionOp.from_jacobian(fn, params, X[:8], batch_size=4,
                                                 mesh=Mesh(np.array(jax.devices()), ("model",)))


def test_projected_posteriors_on_a_mesh_equal_one_device():
    import posteriors as pst

    fn, params, X, y, _ = _problem(Gaussian(1.0))
    X, y = X[:20], y[:20]
    key = jax.random.key(21)
    exact = _exact_projection(fn, params, X)
    for options in (dict(mesh=_mesh()), dict(mesh=_mesh(jax.devices()[:2]), split_sweeps=True)):
        post = pst.projected_posterior(fn, params, X, batch_size=4, prior_precision=2.0, **options)
        samples = post.sample(key, 6, mesh=options["mesh"])
        eps = draws.normal(key, (post.mean.shape[0], 6))
        assert_close(samples, post.mean[None, :] + (exact @ eps).T / jnp.sqrt(2.0), atol=1e-5)
    one = pst.loss_projected_posterior(fn, params, (X, y), Gaussian(1.0), batch_size=4)
    many = pst.loss_projected_posterior(fn, params, (X, y), Gaussian(1.0), batch_size=4, mesh=_mesh())
    V = draws.normal(jax.random.key(22), (one.mean.shape[0], 3))
    assert_close(many.covariance.mm(V), one.covariance.mm(V), atol=1e-6)


def test_subnetwork_and_fsp_laplace_on_a_mesh_equal_one_device():
    import posteriors as pst
    from linops.kernels import RBF

    fn, params, X, y, _ = _problem(Categorical())
    sub = pst.subnetwork.from_indices(params, np.arange(0, 80, 3))
    one = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, prior_precision=2.0, batch_size=4)
    many = pst.subnetwork_laplace(fn, params, (X, y), Categorical(), sub, prior_precision=2.0, batch_size=4,
                                  mesh=_mesh())
    assert_close(many.covariance.as_matrix(), one.covariance.as_matrix(), rtol=1e-8, atol=1e-12)
    fn, params, X, y, _ = _problem(Gaussian(0.5))
    C = draws.normal(jax.random.key(23), (13, 3))  # 26 context outputs: 13 points over 8 devices
    options = dict(likelihood=Gaussian(0.5), rank=12, batch_size=4, context_batch_size=3)
    one = pst.fsp_laplace(fn, params, (X, y), RBF(), C, **options)
    many = pst.fsp_laplace(fn, params, (X, y), RBF(), C, mesh=_mesh(), **options)
    assert_close(many.covariance.as_matrix(), one.covariance.as_matrix(), rtol=1e-7, atol=1e-10)
    assert_close(pst.predictive.linearized(many, X[:5])[1], pst.predictive.linearized(one, X[:5])[1], rtol=1e-7)


@pytest.mark.parametrize("devices", [2, 8])
def test_sample_parallel_projection_with_the_factors_left_in_place(devices):
    import posteriors as pst

    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    fn, params, X, _, _ = _problem(Gaussian(1.0))
    X = X[:12]  # 3 batches, 24 rows, 80 weights: well conditioned, so the tolerance bounds the error
    mesh = _mesh(jax.devices()[:devices])
    exact = _exact_projection(fn, params, X)
    Pi = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, mesh=mesh)
    one = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4)
    V = draws.normal(jax.random.key(30), (Pi.shape[0], 19))  # 19 columns: an uneven split, remainder too
    r = Pi.project_samples(V)
    for out in (r.value, Pi @ V, jax.jit(lambda A, V: A @ V)(Pi, V)):
        assert_close(out, exact @ V, atol=1e-5)
        assert_close(out, one @ V, atol=1e-5)
    # per-column diagnostics, as one device's `project` reports them
    assert r.sweeps.shape == r.converged.shape == r.kernel_residual.shape == (19,)
    assert bool(jnp.all(r.converged)) and bool(jnp.all(r.kernel_residual < 1e-6))
    single = [one.project(V[:, j]) for j in (0, 18)]
    for j, s in zip((0, 18), single, strict=True):
        assert abs(int(r.sweeps[j]) - int(s.sweeps)) <= 10
        assert_close(r.kernel_residual[j], s.kernel_residual, rtol=0.5, atol=1e-9)
    # each column's rotated sweep is still a symmetric sweep: a kernel vector is left alone
    K = exact @ V
    assert_close(Pi.project_samples(K).value, K, atol=1e-8)
    post = pst.projected_posterior(fn, params, X, batch_size=4, prior_precision=2.0, mesh=mesh)
    key = jax.random.key(31)
    eps = draws.normal(key, (post.mean.shape[0], 16))
    assert_close(post.sample(key, 16), post.mean[None, :] + (exact @ eps).T / jnp.sqrt(2.0), atol=1e-5)
    with pytest.raises(ValueError, match="already runs on a mesh of its own"):
        lo.sharded_mm(Pi, V, mesh)


def test_the_projection_memory_check_counts_one_devices_share(monkeypatch):
    import linops.memory

    fn, params, X, _, _ = _problem(Gaussian(1.0))
    X = X[:20]  # 5 batches of 8 rows, 80 weights, float64: 15,360 bytes of factors on one device
    monkeypatch.setattr(linops.memory, "available_bytes", lambda device=None: 13_000)
    with pytest.raises(linops.memory.MemoryBudgetError, match="the factors of 5 batches of 8 rows"):
        lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4)
    # on 8 devices each holds one (padded) batch: 11,264 bytes, which fit
    Pi = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, mesh=_mesh())
    assert Pi.W.shape[0] == 8
    monkeypatch.setattr(linops.memory, "available_bytes", lambda device=None: 10_000)
    with pytest.raises(linops.memory.MemoryBudgetError, match="the factors of 1 batches of 8 rows .* per device"):
        lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, mesh=_mesh())
