"""AlternatingProjectionOp's ``precision``: every product and convolution it traces (the set-up's, the network's
passes inside it, the sweeps') runs at the precision asked for, whatever `jax.default_matmul_precision` is in
effect around it. A GPU's default float32 products (TF32) stall its CG; CPUs compute float32 in full whatever is
asked, so here the check is on the programs themselves: the precision each product carries in the traced program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import linops as lo
import posteriors as pst

from ._util import equations

HIGHEST = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
HIGH = (lax.Precision.HIGH, lax.Precision.HIGH)  # what "tensorfloat32" asks for
_seen = []  # the precision in effect each time the network is traced


def _cnn(p, x):
    _seen.append(jax.config.jax_default_matmul_precision)
    h = lax.conv_general_dilated(x[None, None], p["K"], (1, 1), "VALID")  # (1, 2, 4, 4)
    return p["W"] @ jnp.tanh(h.reshape(-1)) + p["b"]


def _setup():
    rng = np.random.default_rng(0)
    params = {"K": jnp.asarray(rng.standard_normal((2, 1, 2, 2))), "W": jnp.asarray(rng.standard_normal((3, 32)) / 6),
              "b": jnp.zeros(3)}
    return params, jnp.asarray(rng.standard_normal((4, 5, 5)))


def _products(jaxpr):
    """The precision of every dot_general and convolution in ``jaxpr`` and in the programs nested in it."""
    return [(eqn.primitive.name, eqn.params["precision"]) for eqn in equations(jaxpr)
            if eqn.primitive.name in ("dot_general", "conv_general_dilated")]


@pytest.mark.parametrize("storage", ["rows", True, False])
def test_every_product_of_the_set_up_and_the_sweeps_is_at_the_precision_asked_for(storage):
    params, X = _setup()
    x = jnp.asarray(np.random.default_rng(1).standard_normal(3 * 32 + 8 + 3))
    with jax.default_matmul_precision("tensorfloat32"):  # a GPU's default for float32, made explicit
        _seen.clear()
        Pi = lo.AlternatingProjectionOp.from_jacobian(_cnn, params, X, batch_size=2, store_linearization=storage)
        built = list(_seen)
        assert built and set(built) == {"highest"}  # the rows, Grams and factors: the network traced at highest
        _seen.clear()
        found = _products(jax.make_jaxpr(Pi.project)(x).jaxpr)
        found += _products(jax.make_jaxpr(Pi.project_samples)(jnp.stack([x, -x], axis=1)).jaxpr)
        found += _products(jax.make_jaxpr(Pi.symmetric_sweep)(x).jaxpr)
        assert set(_seen) <= {"highest"}  # recomputed passes (storage False) too
        assert {name for name, _ in found} >= ({"dot_general", "conv_general_dilated"} if storage is False
                                              else {"dot_general"})
        assert all(precision == HIGHEST for _, precision in found), found
        # precision=None keeps what is in effect around the call: the check above can fail
        inherit = lo.AlternatingProjectionOp.from_jacobian(_cnn, params, X, batch_size=2, store_linearization=storage,
                                                           precision=None)
        found = _products(jax.make_jaxpr(inherit.project)(x).jaxpr)
        assert found and all(precision == HIGH for _, precision in found), found
    # and the projection itself: the same projector either way on a CPU (float32 products are full there)
    assert Pi.precision == "highest" and inherit.precision is None
    np.testing.assert_allclose(Pi @ x, inherit @ x, rtol=1e-10, atol=1e-12)


def test_the_projected_posterior_passes_the_precision_on():
    """(A precision it does not know is refused before any work: tests/test_bad_input.py.)"""
    params, X = _setup()
    post = pst.projected_posterior(_cnn, params, X, batch_size=2, progress=False)
    assert post.projection.precision == "highest"
    post = pst.projected_posterior(_cnn, params, X, batch_size=2, progress=False, precision="float32")
    assert post.projection.precision == "float32"
