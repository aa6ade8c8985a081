"""Parameters sharded over devices (model parallel, issue 35 item 6) against one device (run with 8 devices).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 pytest -m distributed -n 0

Every leaf of an MLP is split over a one-axis ``"model"`` mesh (`linops.models.shard`); the Laplace fits, the
predictive variances and the samples equal the single-device ones, the fitted diagonal stays split, and the memory
plan refuses on one device what only the mesh can hold, and on the mesh what even it cannot.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import linops as lo
import posteriors as pst
from linops.likelihoods import Categorical
from linops.memory import MemoryBudgetError
from linops.models import from_equinox, num_shards, ravel, shard
from tests import _draws as draws

from ..linops._util import assert_close

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS=...device_count=8)"),
]


def _problem():
    fn, params = from_equinox(eqx.nn.MLP(16, 8, 64, 2, activation=jnp.tanh, key=jax.random.key(0)))
    X = draws.normal(jax.random.key(1), (40, 16))
    y = jax.random.randint(jax.random.key(2), (40,), 0, 8)
    return fn, params, X, y


def _mesh():
    return Mesh(np.array(jax.devices()[:8]), ("model",))


def _fit(fn, params, X, y, structure):
    kw = {"rank": 6, "key": jax.random.key(3)} if structure == "lowrank" else {}
    return pst.laplace(fn, params, (X, y), Categorical(), structure=structure, prior_precision=0.5, **kw)


@pytest.mark.parametrize("structure", ["diag", "kfac", "lowrank"])
def test_a_sharded_fit_predictive_and_samples_equal_one_devices(structure):
    fn, params, X, y = _problem()
    sharded = shard(params, _mesh())
    assert num_shards(sharded) == 8 and num_shards(params) == 1
    one, many = _fit(fn, params, X, y, structure), _fit(fn, sharded, X, y, structure)
    var_one = pst.predictive.linearized(one, X[:6])[1]
    var_many = pst.predictive.linearized(many, X[:6])[1]
    assert float(var_one.min()) > 1e-4
    assert_close(var_many, var_one, rtol=1e-9)
    assert_close(many.sample(jax.random.key(4), 3), one.sample(jax.random.key(4), 3), rtol=1e-9, atol=1e-12)
    if structure == "diag":  # the fitted diagonal is split as the parameters are: each device holds its share
        P = ravel(params)[0].size
        split = [leaf for leaf in jax.tree_util.tree_leaves(many.ggn) if getattr(leaf, "size", 0) >= P // 8
                 and not leaf.sharding.is_fully_replicated]
        assert split, "no part of the fitted diagonal is sharded"


def test_the_plan_refuses_one_device_and_the_too_small_mesh_before_any_work(monkeypatch):
    """With one device's budget an eighth of what the diagonal fit needs (a model with 8x the parameters one device
    allows), it is refused unsharded (naming the devices a sharded fit needs) and fits over 8 devices, equal to the
    unconstrained fit; with a sixteenth, even the mesh is refused."""
    fn, params, X, y = _problem()
    P = ravel(params)[0].size
    need = 3 * P * np.dtype(ravel(params)[0].dtype).itemsize  # the parameters and the diagonal's state
    reference = pst.predictive.linearized(_fit(fn, params, X, y, "diag"), X[:6])[1]
    sharded = shard(params, _mesh())
    monkeypatch.setattr(lo.memory, "available_bytes", lambda device=None: need // 8)
    with pytest.raises(MemoryBudgetError, match=r"shard the parameters over a mesh of at least 8 devices"):
        _fit(fn, params, X, y, "diag")
    assert_close(pst.predictive.linearized(_fit(fn, sharded, X, y, "diag"), X[:6])[1], reference, rtol=1e-9)
    monkeypatch.setattr(lo.memory, "available_bytes", lambda device=None: need // 16)
    with pytest.raises(MemoryBudgetError, match=r"sharded over 8 devices: each device's share .* even this mesh is "
                                                r"too small: use at least 16 devices"):
        _fit(fn, sharded, X, y, "diag")
