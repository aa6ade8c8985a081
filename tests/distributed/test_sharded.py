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
    X = jax.random.normal(jax.random.key(1), (N, 3))
    if isinstance(likelihood, Categorical):
        y = jax.random.randint(jax.random.key(2), (N,), 0, 2)
    else:
        y = jax.random.normal(jax.random.key(2), (N, 2))
    v = jax.random.normal(jax.random.key(3), (ravel(params)[0].shape[0],))
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


def test_jacobian_and_loss_jacobian_match_one_device():
    fn, params, X, y, v = _problem(Categorical())
    mesh = _mesh()
    J1, J8 = lo.JacobianOp(fn, params, X, batch_size=4), lo.JacobianOp(fn, params, X, batch_size=4, mesh=mesh)
    u = jax.random.normal(jax.random.key(4), (J1.shape[0],))
    assert_close(J8 @ v, J1 @ v, rtol=1e-10)
    assert_close(J8.T @ u, J1.T @ u, rtol=1e-10)
    L1 = lo.LossJacobianOp(fn, params, X, y, Categorical(), batch_size=4)
    L8 = lo.LossJacobianOp(fn, params, X, y, Categorical(), batch_size=4, mesh=mesh)
    w = jax.random.normal(jax.random.key(5), (N,))
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


@pytest.mark.parametrize("structure", ["full", "diag", "last_layer", "lowrank"])
def test_laplace_posteriors_on_a_mesh_equal_one_device(structure):
    import posteriors as pst

    fn, params, X, y, _ = _problem(Categorical())
    options = dict(structure=structure, batch_size=4, prior_precision=0.5)
    if structure == "lowrank":
        options.update(rank=5, key=jax.random.key(6))
    one = pst.laplace(fn, params, (X, y), Categorical(), **options)
    many = pst.laplace(fn, params, (X, y), Categorical(), mesh=_mesh(), **options)
    assert_close(many.covariance.as_matrix(), one.covariance.as_matrix(), rtol=1e-8, atol=1e-10)
    assert_close(pst.marginal_log_likelihood(many), pst.marginal_log_likelihood(one), rtol=1e-10)
    assert_close(pst.predictive.linearized(many, X[:5])[1], pst.predictive.linearized(one, X[:5])[1], rtol=1e-8)


def test_kfac_on_a_mesh_is_refused_before_any_work():
    import posteriors as pst

    fn, params, X, y, _ = _problem(Categorical())
    with pytest.raises(ValueError, match="not computed on a mesh yet"):
        pst.laplace(fn, params, (X, y), Categorical(), structure="kfac", mesh=_mesh())


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
    eps = jax.random.normal(key, (post.mean.shape[0], 19))
    assert_close(many, one, atol=1e-5)
    assert_close(many, post.mean[None, :] + (exact @ eps).T / jnp.sqrt(2.0), atol=1e-5)
    Pi = post.projection
    V = jax.random.normal(jax.random.key(8), (Pi.shape[0], 16))
    assert_close(lo.sharded_mm(Pi, V, mesh), exact @ V, atol=1e-5)
    one = lo.hutchinson(Pi, jax.random.key(9), 24)
    many = lo.hutchinson(Pi, jax.random.key(9), 24, mesh=mesh)
    assert_close(many.value, one.value, rtol=1e-5)
    assert_close(many.standard_error, one.standard_error, rtol=1e-4)
    with pytest.raises(ValueError, match="needs V of shape"):
        lo.sharded_mm(Pi, V[:-1], mesh)
