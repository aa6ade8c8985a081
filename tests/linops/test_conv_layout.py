"""`linops.runtime.canonical_convolutions`: the same values and derivatives, every convolution (nested in
jitted calls, branches and loops too) in the CPU backend's fast layout."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linops.runtime import canonical_convolutions
from tests import _draws as draws

CASES = [  # (input shape, kernel shape, strides, padding, lhs dilation, rhs dilation, dimension numbers, groups)
    ((2, 6, 9, 8), (8, 3, 3, 2), (2, 1), ((1, 2), (0, 1)), (1, 1), (2, 1), ("NCHW", "OIHW", "NCHW"), 2),
    ((2, 9, 8, 6), (3, 2, 6, 4), (1, 2), "SAME", (1, 1), (1, 1), ("NHWC", "HWIO", "NHWC"), 1),
    ((2, 6, 9, 8), (3, 2, 6, 4), (1, 1), ((1, 0), (2, 1)), (2, 1), (1, 1), ("NCHW", "HWIO", "NHWC"), 1),
    ((3, 4, 10), (6, 2, 3), (1,), "SAME", (1,), (1,), ("NCH", "OIH", "NHC"), 2),
    ((2, 2, 5, 4, 4), (3, 2, 2, 2, 2), (1, 1, 2), "SAME", (1, 1, 1), (1, 1, 1), ("NCDHW", "OIDHW", "NCDHW"), 1),
]
CANONICAL = {1: "[b, 0, f]x[0, i, o]->[b, 0, f]", 2: "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]",
             3: "[b, 0, 1, 2, f]x[0, 1, 2, i, o]->[b, 0, 1, 2, f]"}


def _conv(case):
    _, _, strides, padding, lhs_dilation, rhs_dilation, dims, groups = case
    return lambda x, w: jax.lax.conv_general_dilated(x, w, strides, padding, lhs_dilation, rhs_dilation, dims,
                                                     feature_group_count=groups)


def _inputs(case, dtype=jnp.float64):
    k = jax.random.split(jax.random.key(0), 3)
    x = draws.normal(k[0], case[0], dtype)
    w = draws.normal(k[1], case[1], dtype)
    g = draws.normal(k[2], jax.eval_shape(_conv(case), x, w).shape, dtype)
    return x, w, g


def _convolutions(fn, *args):
    """The dimension numbers of every convolution in ``fn``'s lowered program."""
    text = jax.jit(fn).lower(*args).as_text()
    return re.findall(r"stablehlo\.convolution.*?dim_numbers = (\[[^]]*\]x\[[^]]*\]->\[[^]]*\])", text)


@pytest.mark.parametrize("case", CASES, ids=[c[6][0] + "-" + c[6][1] + "-" + c[6][2] for c in CASES])
def test_values_and_derivatives_are_the_convolutions(case):
    """Value, VJP (both operands, grouped kernels included: batch groups in the kernel's gradient) and JVP of
    a convolution in any layout, rewritten outside and inside the derivative, equal the original's."""
    with jax.enable_x64(True):
        x, w, g = _inputs(case)
        f = _conv(case)

        def everything(f):
            return lambda x, w: (f(x, w), jax.vjp(f, x, w)[1](g), jax.jvp(f, (x, w), (2 * x, -w))[1])

        want = everything(f)(x, w)
        for got in (jax.jit(canonical_convolutions(everything(f)))(x, w),
                    jax.jit(everything(canonical_convolutions(f)))(x, w)):
            for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        dims = _convolutions(canonical_convolutions(everything(f)), x, w)
        assert len(dims) >= 5 and set(dims) == {CANONICAL[len(case[0]) - 2]}, dims  # value, 2 VJP, 2 JVP terms


def test_nested_programs_are_rewritten():
    """Convolutions inside a scan whose body calls a jitted function, a branch and a vmap, with the kernel closed
    over from the outer trace: all rewritten (the unrewritten program keeps NCHW), the result unchanged."""
    case = CASES[0]
    with jax.enable_x64(True):
        x, w, _ = _inputs(case)
        conv = _conv(case)
        inner = jax.jit(lambda x, w: jnp.sum(jnp.tanh(conv(x, w))))

        def program(xs, w):
            def body(c, x):
                branch = jax.lax.cond(c > 0, lambda: inner(x, w), lambda: inner(x, -w))
                mapped = jnp.sum(jax.vmap(lambda xi: conv(xi[None], w))(x) ** 2)
                return c + branch + mapped, jax.grad(inner)(x, w)
            return jax.lax.scan(body, jnp.ones((), x.dtype), xs)

        xs = jnp.stack([x, -0.5 * x, 2 * x])
        want = program(xs, w)
        got = jax.jit(lambda xs, w: canonical_convolutions(lambda w: program(xs, w))(w))(xs, w)
        for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11)
        assert set(_convolutions(canonical_convolutions(program), xs, w)) == {CANONICAL[2]}
        assert CANONICAL[2] not in _convolutions(program, xs, w)  # the check can fail


def test_without_convolutions_the_function_is_unchanged():
    """No convolution: ``fn``'s own program (and pytree output) is returned."""
    fn = lambda tree: {"a": jnp.sin(tree[0]) @ tree[1], "b": (tree[1] ** 2,)}  # noqa: E731
    args = ((jnp.ones((2, 3)), jnp.arange(3.0)),)
    got = canonical_convolutions(fn)(*args)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(fn(*args))
    np.testing.assert_array_equal(got["a"], fn(*args)["a"])
    assert jax.make_jaxpr(canonical_convolutions(fn))(*args).eqns[0].primitive.name == "sin"
