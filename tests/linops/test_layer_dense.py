"""The dense GGN by Kronecker blocks (`linops.nn._layer_dense`) against explicit Jacobians.

The blocks path is what `GGNOp.as_matrix` takes for models whose every parameter is in a dense layer
on a vector; the reference here is $\\sum_n J_n^\\top A_n^\\top A_n J_n$ from `jax.jacrev`, independent
of both paths.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linops as lo
from linops.likelihoods import Categorical, Gaussian
from linops.models import from_equinox, ravel
from linops.nn import _layer_dense, _operators
from linops.nn._layer_diag import layer_plan
from tests import _draws as draws

from ._util import assert_close


def _reference(fn, params, X, Y, lik):
    """The GGN from whole-network Jacobians, example by example."""
    flat, unravel = ravel(params)
    total = 0.0
    for n in range(X.shape[0]):
        J = jax.jacrev(lambda v, n=n: fn(unravel(v), X[n]))(flat)  # (O, P)
        A = (lik if not lik.per_example else jax.tree_util.tree_map(lambda a, n=n: a[n], lik)).hessian_factor(
            fn(params, X[n]), Y[n])
        total = total + np.asarray(J).T @ np.asarray(A).T @ np.asarray(A) @ np.asarray(J)
    return total


def _transposed(p, x):
    """``x @ W`` layouts (the output index last), a bias listed before its weight, no bias on the middle layer."""
    h = jnp.tanh(x @ p["a_w"] + p["0_b"])
    h = jnp.tanh(h @ p["b_w"])
    return p["c_w"] @ h + p["c_b"]


def _cases():
    fn, params = from_equinox(eqx.nn.MLP(5, 4, 6, 2, key=jax.random.key(0), dtype=jnp.float64,
                                         activation=jnp.tanh))
    X = draws.normal(jax.random.key(1), (13, 5), jnp.float64)
    yield "mlp-categorical", fn, params, X, jnp.arange(13) % 4, Categorical()
    k = jax.random.split(jax.random.key(2), 5)
    p = {"a_w": draws.normal(k[0], (5, 6), jnp.float64), "0_b": 0.1 * draws.normal(k[1], (6,), jnp.float64),
         "b_w": draws.normal(k[2], (6, 3), jnp.float64) / 2, "c_w": draws.normal(k[3], (2, 3), jnp.float64),
         "c_b": jnp.array([0.3, -0.2], jnp.float64)}
    Y = draws.normal(k[4], (13, 2), jnp.float64)
    sigma = jnp.linspace(0.5, 1.5, 13 * 2).reshape(13, 2)
    yield "transposed-heteroscedastic", _transposed, p, X, Y, Gaussian(sigma, heteroscedastic=True)


CASES = {name: case for name, *case in _cases()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kronecker_blocks_give_the_dense_ggn(name, monkeypatch):
    """Blocks path (batches of 4: a short last batch), under jit too, and the rows path, against Jacobians."""
    fn, params, X, Y, lik = CASES[name]
    plan = layer_plan(fn, params, X[0])
    assert plan is not None and _layer_dense.dense_only(plan)
    expected = _reference(fn, params, X, Y, lik)
    assert np.ptp(np.diag(expected)) > 0 and np.abs(expected - np.diag(np.diag(expected))).max() > 1e-3
    G = lo.GGNOp(fn, params, X, Y, lik, batch_size=4)
    assert_close(G.as_matrix(), expected, rtol=1e-10)
    assert_close(jax.jit(lambda G: G.as_matrix())(G), expected, rtol=1e-10)
    assert _layer_dense.dense_chunk(plan, 4) == 4  # the blocks path: as many examples per batch as the rows
    assert_close(_layer_dense.layer_dense_ggn(plan, lik, X, Y, 1, None, "data"), expected, rtol=1e-10)  # 1 per batch
    monkeypatch.setattr(_layer_dense, "_BUDGET", 1)  # blocks would need smaller batches than the rows: the rows
    assert _layer_dense.dense_chunk(plan, 4) == 1
    assert_close(G.as_matrix(), expected, rtol=1e-10)
    monkeypatch.setattr(_operators, "dense_only", lambda plan: False)  # the rows path
    assert_close(G.as_matrix(), expected, rtol=1e-10)


def test_models_with_parameters_outside_dense_layers_take_the_rows_path():
    mlp = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0), dtype=jnp.float64)
    fn, params = from_equinox(mlp)
    assert _layer_dense.dense_only(layer_plan(fn, params, jnp.ones(3)))

    def scaled(p, x):  # an elementwise scale is in no layer
        return fn(p["mlp"], x) * p["s"]

    p = {"mlp": params, "s": jnp.array([1.0, 2.0], jnp.float64)}
    assert not _layer_dense.dense_only(layer_plan(scaled, p, jnp.ones(3)))
    X = draws.normal(jax.random.key(1), (5, 3), jnp.float64)
    assert_close(lo.GGNOp(scaled, p, X, jnp.arange(5) % 2, Categorical()).as_matrix(),
                 _reference(scaled, p, X, jnp.arange(5) % 2, Categorical()), rtol=1e-10)
