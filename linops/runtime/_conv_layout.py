r"""Convolutions inside loops in the layout XLA's CPU backend runs fast.

XLA's CPU compiler moves a convolution into its fast layout (batch first, features last, kernel
``spatial..., in, out``) only in a program's top level. Inside a loop body (the batches of
`linops.runtime.batched_map`, a Lanczos or CG iteration) a convolution in any other layout, such as the
``NCHW`` of Equinox and PyTorch-style models and the transposed convolutions of every reverse pass,
is compiled as a naive loop nest: measured 9 times slower for one 5x5 convolution of 128 images,
and 2.3 times slower for a whole LeNet-5 forward pass, than the same program unrolled.

`canonical_convolutions` rewrites a function's program so that every convolution (in nested
jitted calls, loops and branches too) reads and writes that layout, with explicit transposes
around it. The result is the same computation: a convolution's meaning is fixed by which axis
is the batch, the feature and each spatial axis (``dimension_numbers``), not by their order in
memory. On other backends the function is returned unchanged.
"""

from __future__ import annotations

import functools

import jax
import jax.extend as jex
from jax import lax

_CONV = "conv_general_dilated"


def has_conv(jaxpr) -> bool:
    """Whether ``jaxpr`` (a `Jaxpr`) or one nested in it (a loop body, a branch, a nested jit) has a convolution.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.runtime import has_conv
        >>> conv = lambda x: jax.lax.conv(x, jnp.ones((1, 1, 3, 3)), (1, 1), "SAME")
        >>> has_conv(jax.make_jaxpr(conv)(jnp.ones((1, 1, 8, 8))).jaxpr)
        True
        >>> has_conv(jax.make_jaxpr(jnp.sin)(1.0).jaxpr)
        False
    """
    return (any(eqn.primitive.name == _CONV for eqn in jaxpr.eqns)
            or any(has_conv(sub) for sub in jex.core.subjaxprs(jaxpr)))


def _conv_canonical(lhs, rhs, *, dimension_numbers, **params):
    """One ``conv_general_dilated`` computed in the layout ``(batch, spatial..., feature)``, kernel
    ``(spatial..., in, out)``: the operands transposed into it, the result transposed back."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    n = len(lhs_spec) - 2
    spatial = tuple(range(1, n + 1))
    lhs = lax.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    rhs = lax.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    dims = lax.ConvDimensionNumbers(lhs_spec=(0, n + 1, *spatial), rhs_spec=(n + 1, n, *range(n)),
                                    out_spec=(0, n + 1, *spatial))
    out = lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=dims, **params)
    # out is (batch, spatial..., feature); out_spec names where each of those goes
    order = (out_spec[0], *out_spec[2:], out_spec[1])
    inverse = [0] * len(order)
    for position, axis in enumerate(order):
        inverse[axis] = position
    return lax.transpose(out, tuple(inverse))


def _rewrite_closed(closed):
    """A `ClosedJaxpr` with its convolutions in the fast layout (the same input and output types)."""
    if not has_conv(closed.jaxpr):
        return closed
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
             for v in closed.jaxpr.invars]
    new = jax.make_jaxpr(lambda *args: _eval(closed.jaxpr, closed.consts, args))(*avals)
    return new


def _rewrite_params(params):
    """``params`` with every `ClosedJaxpr` in them (a loop's body, a branch, a jitted call) rewritten."""
    def one(value):
        if isinstance(value, jex.core.ClosedJaxpr):
            return _rewrite_closed(value)
        if isinstance(value, tuple) and value and all(isinstance(v, jex.core.ClosedJaxpr) for v in value):
            return tuple(_rewrite_closed(v) for v in value)
        return value

    return {k: one(v) for k, v in params.items()}


def _eval(jaxpr, consts, args):
    env = {}

    def read(v):
        return v.val if isinstance(v, jex.core.Literal) else env[v]

    for v, value in zip(jaxpr.constvars, consts, strict=True):
        env[v] = value
    for v, value in zip(jaxpr.invars, args, strict=True):
        env[v] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with eqn.ctx.manager:
            if eqn.primitive.name == _CONV:
                outs = [_conv_canonical(*invals, **eqn.params)]
            else:
                params = _rewrite_params(eqn.params) if _eqn_has_conv(eqn) else eqn.params
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
                if not eqn.primitive.multiple_results:
                    outs = [outs]
        for v, value in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jex.core.DropVar):
                env[v] = value
    return [read(v) for v in jaxpr.outvars]


def _eqn_has_conv(eqn) -> bool:
    return any(has_conv(sub) for sub in jex.core.jaxprs_in_params(eqn.params))


def canonical_convolutions(fn):
    """``fn`` with every convolution of its program in the layout XLA's CPU backend compiles fast inside
    loops (the module docstring); ``fn``'s program unchanged when it has no convolution, and ``fn``
    itself when the default backend is not the CPU. The values are the same.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.runtime import canonical_convolutions
        >>> w = jnp.ones((4, 3, 2, 2))                        # OIHW
        >>> f = lambda x: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID")   # NCHW
        >>> x = jnp.arange(2 * 3 * 5 * 5.0).reshape(2, 3, 5, 5)
        >>> bool(jnp.allclose(canonical_convolutions(f)(x), f(x)))
        True
    """

    @functools.wraps(fn)
    def wrapped(*args):
        if jax.default_backend() != "cpu":
            return fn(*args)
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        leaves = jax.tree_util.tree_leaves(args)
        if has_conv(closed.jaxpr):
            out = _eval(closed.jaxpr, closed.consts, leaves)
        else:  # the program as traced (not fn traced again)
            out = jex.core.jaxpr_as_fun(closed)(*leaves)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), out)

    return wrapped
