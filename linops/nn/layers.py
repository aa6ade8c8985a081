r"""The layers KFAC recognises in a per-example model's traced program, and the program rewritten to expose them.

A *layer* is a product of one parameter leaf $W$ (used nowhere else) with an activation, read as
$s_r = W a_r$ for shared positions $r = 1..R$:

- a ``dot_general`` of a leaf kernel (used once) with an activation of any rank, contracting the
  kernel's leading or trailing axes with as many of the activation's (a dense layer: a matrix, an
  einsum kernel, Flax's ``LinearGeneral``, attention's per-head projections; its activation's other
  axes, tokens or pixels, are the positions; $R = 1$ for a vector);
- a ``conv_general_dilated`` whose kernel is a leaf, any stride, padding, dilation and feature
  groups: the activations are the input's patches (`conv_patches`, the values of
  `jax.lax.conv_general_dilated_patches` by strided slices), the
  positions the output's batch and spatial axes. With $G$ groups each group is its own layer
  over its own channels.

A bias is a leaf added to the layer's output (through axis moves and unit-axis reshapes only)
broadcast along the output channels. The rewritten program adds a zero perturbation $\delta$ to
each layer's output and also returns its activation, so one forward pass gives every
$a_{n,r}$ and vector-Jacobian products give every $g_{n,r} = \partial(\cdot)/\partial s_{n,r}$.

It also computes each non-overlapping max-pool (``reduce_window_max`` with stride equal to window,
no padding or dilation) as `first_max_pool`: the same values and the same derivative, but a
reverse pass that multiplies by a mask found once per example, where XLA's ``select_and_scatter``
searches every window again for every one of the $K$ rows (3x faster reverse passes on LeNet-5).

This is the public way to write a per-layer rule of your own (a quantity of every Jacobian row that
needs only a layer's activations and output gradients, as `linops.kfac` and the diagonal GGN do): find
the layers with `trace_layers`, run one forward pass per example with `tapped_vjp`, and pull back each row.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linops.nn.layers import tapped_vjp, trace_layers
    >>> fn = lambda p, x: jnp.tanh(x @ p["W"]) @ p["V"]          # two dense layers, no biases
    >>> params = {"V": jnp.ones((4, 2)), "W": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
    >>> x = jnp.array([0.5, -1.0, 2.0])
    >>> layers, tapped, leaves = trace_layers(fn, params, x)
    >>> [(L.kind, L.weight, L.num_in, L.num_out) for L in layers]   # leaf 1 is W, leaf 0 is V
    [('dense', 1, 3, 4), ('dense', 0, 4, 2)]
    >>> out, vjp, acts = tapped_vjp(layers, tapped, leaves, [], x)
    >>> (g_W, g_V), _ = vjp(jnp.array([1.0, 0.0]))              # output 0's gradients at the layer outputs
    >>> row = jnp.outer(acts[0], g_W)                             # d out[0] / dW, in W's (in, out) layout
    >>> bool(jnp.allclose(row, jax.jacobian(fn)(params, x)["W"][0]))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

from linops.runtime._memo import memo


class Layer(NamedTuple):
    """One recognised layer. ``acts(a) -> (G, in, R)`` and ``grads(g) -> (G, out, R)`` turn the raw activation
    and the gradient at the layer's output (its shape) into columns over the positions, feature-major: the
    positions are the minor axis, so that the contractions over them (a row's gradient, a Kronecker factor)
    are matrix products on the data as the model lays it out (a channel-first convolution's needs no
    transpose); ``in_perm`` reorders the activation factor from patch order into the kernel's row-major order
    (None: already in it). `trace_layers` returns them (examples there and in the module's documentation)."""

    kind: str  # "dense" or "conv"
    weight: int  # leaf index
    bias: int | None
    out_first: bool  # the weight's row-major order has the output index first: G ~ B (x) A; else A (x) B
    groups: int
    positions: int  # R
    num_in: int  # per group
    num_out: int  # per group
    acts: Callable
    grads: Callable
    in_perm: np.ndarray | None
    out_aval: object  # the layer output's abstract value (the perturbation's shape)


def _is_var(v):
    return isinstance(v, jex.core.Var)


def _dense(eqn, leaf_vars, uses):
    """A ``dot_general`` of a leaf kernel with an activation: a matrix, or a kernel of several axes (an einsum,
    Flax's ``LinearGeneral``, attention's per-head projections) whose contracted axes come first or last, so
    that in its row-major order the input index block comes first or last (a Kronecker-ordered layer)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if lb or rb or not lc:
        return None
    lhs, rhs = eqn.invars
    for w, a, wc, ac, w_is_lhs in ((lhs, rhs, lc, rc, True), (rhs, lhs, rc, lc, False)):
        if not (_is_var(w) and w in leaf_vars and uses[w] == 1 and _is_var(a) and a not in leaf_vars):
            continue
        leaf, transposed = leaf_vars[w]
        nd, k = w.aval.ndim, len(wc)
        pairs = sorted(zip(wc, ac, strict=True))  # the contracted axes in the kernel's order
        w_in, a_in = [p[0] for p in pairs], [p[1] for p in pairs]
        if k == nd or w_in not in (list(range(k)), list(range(nd - k, nd))):
            continue  # no output axis, or an input block in the middle of the kernel
        in_first = w_in == list(range(k))
        num_in = int(np.prod([w.aval.shape[i] for i in w_in], dtype=int))
        num_out = w.aval.size // num_in
        positions = int(np.prod([s for i, s in enumerate(a.aval.shape) if i not in a_in], dtype=int))
        # the output's kernel axes: a dot_general's output is the lhs's free axes, then the rhs's
        start = 0 if w_is_lhs else a.aval.ndim - k
        w_out = list(range(start, start + nd - k))

        def acts(x, a_in=a_in, num_in=num_in):
            return jnp.moveaxis(x, a_in, range(len(a_in))).reshape(1, num_in, -1)

        def grads(g, w_out=w_out, num_out=num_out):
            return jnp.moveaxis(g, w_out, range(len(w_out))).reshape(1, num_out, -1)

        layer = Layer("dense", leaf, None, (not in_first) != transposed, 1, positions, num_in, num_out, acts, grads,
                      None, eqn.outvars[0].aval)
        return layer, a, tuple(w_out)  # the output axes a bias is looked for along
    return None


def _conv(eqn, leaf_vars, uses):
    lhs, rhs = eqn.invars
    p = eqn.params
    if not (_is_var(rhs) and rhs in leaf_vars and uses[rhs] == 1 and _is_var(lhs) and lhs not in leaf_vars
            and p["batch_group_count"] == 1) or leaf_vars[rhs][1]:
        return None
    dn = p["dimension_numbers"]
    out_dim, in_dim, *spatial = dn.rhs_spec
    groups, ndim = p["feature_group_count"], rhs.aval.ndim
    if out_dim not in (0, ndim - 1):
        return None  # the output index neither first nor last: no Kronecker product in row-major order
    patch_axes = [in_dim, *spatial]
    kernel_axes = [d for d in range(ndim) if d != out_dim]
    perm = None
    if patch_axes != kernel_axes:
        if groups > 1:
            return None
        perm = np.arange(int(np.prod([rhs.aval.shape[d] for d in patch_axes]))).reshape(
            [rhs.aval.shape[d] for d in patch_axes]).transpose([patch_axes.index(d) for d in kernel_axes]).reshape(-1)
    if groups > 1 and out_dim != 0:
        return None  # a group's outputs are not contiguous in the row-major order
    num_out = rhs.aval.shape[out_dim] // groups
    num_in = int(np.prod([rhs.aval.shape[d] for d in patch_axes]))
    out = eqn.outvars[0]
    channel = dn.out_spec[1]
    positions = int(np.prod([s for i, s in enumerate(out.aval.shape) if i != channel], dtype=int))
    filter_shape = tuple(rhs.aval.shape[d] for d in spatial)

    def acts(x):
        patches = conv_patches(x, filter_shape, p["window_strides"], p["padding"], p["lhs_dilation"],
                               p["rhs_dilation"], dn)
        return jnp.moveaxis(patches, channel, 0).reshape(groups, num_in, -1)

    def grads(g):
        return jnp.moveaxis(g, channel, 0).reshape(groups, num_out, -1)

    return Layer("conv", leaf_vars[rhs][0], None, out_dim == 0, groups, positions, num_in, num_out, acts, grads, perm,
                 out.aval), lhs, channel


def conv_patches(x, filter_shape, strides, padding, lhs_dilation, rhs_dilation, dn):
    """`jax.lax.conv_general_dilated_patches` (the same values, features ordered input channel first, then the
    filter's offsets) by strided slices: one per filter offset along each spatial axis in turn, a copy of the
    data where XLA's CPU back end computes the patches as a convolution with an identity kernel (several times
    the model's own convolution's work). ``padding`` is explicit ``(low, high)`` pairs, ``dn`` the
    convolution's `jax.lax.ConvDimensionNumbers`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.nn.layers import conv_patches
        >>> x = jnp.arange(2 * 3 * 5 * 5.0).reshape(2, 3, 5, 5)
        >>> dn = jax.lax.conv_dimension_numbers(x.shape, (4, 3, 3, 3), ("NCHW", "OIHW", "NCHW"))
        >>> ours = conv_patches(x, (3, 3), (2, 1), ((1, 1), (0, 0)), (1, 1), (1, 1), dn)
        >>> ref = jax.lax.conv_general_dilated_patches(x, (3, 3), (2, 1), ((1, 1), (0, 0)), dimension_numbers=dn)
        >>> ours.shape, bool(jnp.array_equal(ours, ref))
        ((2, 27, 3, 3), True)
    """
    batch_axis, feature_axis, *spatial_axes = dn.lhs_spec
    x = jnp.transpose(x, (batch_axis, feature_axis, *spatial_axes))  # (N, C, *spatial)
    zero = jnp.zeros((), x.dtype)
    x = jax.lax.pad(x, zero, [(0, 0, 0), (0, 0, 0)] + [(int(lo), int(hi), int(d) - 1)
                                                       for (lo, hi), d in zip(padding, lhs_dilation, strict=True)])
    for j, (size, stride, dilation) in enumerate(zip(filter_shape, strides, rhs_dilation, strict=True)):
        axis = 2 + 2 * j  # the spatial axis j, after the offset axes of the axes before it
        count = (x.shape[axis] - (size - 1) * dilation - 1) // stride + 1
        pieces = [jax.lax.slice_in_dim(x, k * dilation, k * dilation + (count - 1) * stride + 1, stride, axis)
                  for k in range(size)]
        x = jnp.stack(pieces, axis=axis)  # the offset axis just before its spatial axis
    # (N, C, k_1, s_1, k_2, s_2, ...) -> (N, C, k_1, k_2, ..., s_1, s_2, ...)
    ndim = len(filter_shape)
    x = jnp.transpose(x, (0, 1, *range(2, 2 + 2 * ndim, 2), *range(3, 3 + 2 * ndim, 2)))
    x = x.reshape(x.shape[0], -1, *x.shape[2 + ndim:])  # (N, C K, *out spatial)
    out_batch, out_feature, *out_spatial = dn.out_spec
    order = np.argsort([out_batch, out_feature, *out_spatial])
    return jnp.transpose(x, order)


def _moved_axis(eqn, axis):
    """Where axis ``axis`` of a shape-only op's input lands in its output (None: not a pure axis move)."""
    name, (x,) = eqn.primitive.name, eqn.invars[:1]
    shape_in, shape_out = x.aval.shape, eqn.outvars[0].aval.shape
    if name == "convert_element_type":
        return axis
    if name == "transpose":
        return list(eqn.params["permutation"]).index(axis)
    if name == "squeeze":
        dims = eqn.params["dimensions"]
        return None if axis in dims else axis - sum(d < axis for d in dims)
    if name in ("reshape", "broadcast_in_dim"):
        if name == "broadcast_in_dim":
            return eqn.params["broadcast_dimensions"][axis]
        # a reshape that only inserts or removes unit axes
        if [s for s in shape_in if s != 1] != [s for s in shape_out if s != 1] or shape_in[axis] == 1:
            return None
        k = sum(1 for s in shape_in[:axis] if s != 1)
        return [i for i, s in enumerate(shape_out) if s != 1][k]
    return None


_SHAPE_OPS = ("convert_element_type", "transpose", "squeeze", "reshape", "broadcast_in_dim")


def _find_bias(eqns, start, channels, leaf_vars, uses, uses_of, num_channels):
    """The leaf added to ``start`` (a layer output with its channels on the axes ``channels``, an int for one, in
    the kernel's order) as a per-channel bias: a leaf of one number per channel, its axes in the same order."""
    axes = (channels,) if isinstance(channels, int) else tuple(channels)
    axes = tuple(a for a in axes if start.aval.shape[a] != 1) or axes[:1]  # unit axes carry no order
    var = start
    while True:
        if uses.get(var, 0) != 1 or len(uses_of.get(var, [])) != 1:
            return None  # used twice, or an output of the program
        eqn = uses_of[var][0]
        if eqn.primitive.name == "add":
            other = eqn.invars[1] if eqn.invars[0] is var else eqn.invars[0]
            return _bias_leaf(other, axes, eqn.outvars[0].aval.ndim, leaf_vars, uses, eqns, num_channels)
        if eqn.primitive.name not in _SHAPE_OPS:
            return None
        if eqn.primitive.name == "broadcast_in_dim" and eqn.outvars[0].aval.size != var.aval.size:
            return None  # a real broadcast would copy the layer's output
        axes = tuple(_moved_axis(eqn, a) for a in axes)
        if None in axes:
            return None
        var = eqn.outvars[0]


def _bias_leaf(operand, axes, ndim, leaf_vars, uses, eqns, num_channels):
    """The leaf behind ``operand`` when it is a leaf of ``num_channels`` numbers broadcast along ``axes`` (its own
    non-unit axes onto those, in order)."""
    producer = {v: e for e in eqns for v in e.outvars}
    chain, var = [], operand
    while _is_var(var) and var not in leaf_vars:
        eqn = producer.get(var)
        if eqn is None or eqn.primitive.name not in _SHAPE_OPS:
            return None
        chain.append(eqn)
        var = eqn.invars[0]
    if not (_is_var(var) and var in leaf_vars) or var.aval.size != num_channels or uses[var] != 1:
        return None  # not a leaf of one number per channel, or one used elsewhere too
    shape = var.aval.shape
    big = [i for i, s in enumerate(shape) if s != 1]
    if len(big) != len(axes) and big or (num_channels > 1 and not big):
        return None
    b_axes = big or [0]
    for eqn in reversed(chain):
        b_axes = [_moved_axis(eqn, b) for b in b_axes]
        if None in b_axes:
            return None
    # jax.lax.add broadcasts unit axes: align the ranks from the right as numpy does
    if operand.aval.ndim != ndim:
        b_axes = [b + ndim - operand.aval.ndim for b in b_axes]
    return leaf_vars[var] if tuple(b_axes) == axes else None


def _weight_views(eqns, leaf_vars, uses):
    """``{var: (leaf index, transposed)}`` for the leaves and their single-use views that keep the row-major
    order (reshapes, dtype casts) or swap the two axes of a matrix (``transposed``)."""
    views = {v: (i, False) for v, i in leaf_vars.items()}
    for eqn in eqns:
        x = eqn.invars[0] if eqn.invars else None
        if not (_is_var(x) and x in views and uses[x] == 1):
            continue
        leaf, transposed = views[x]
        name = eqn.primitive.name
        if name in ("reshape", "convert_element_type") and not transposed:
            views[eqn.outvars[0]] = (leaf, False)
        elif name == "transpose" and x.aval.ndim == 2:
            views[eqn.outvars[0]] = (leaf, not transposed)
    return views


def _pool_window(eqn):
    """The window of a non-overlapping, unpadded, undilated max-pool (stride = window), else None."""
    if eqn.primitive.name != "reduce_window_max":
        return None
    p = eqn.params
    window = tuple(p["window_dimensions"])
    if (tuple(p["window_strides"]) != window or any(lo or hi for lo, hi in p["padding"])
            or any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"]))):
        return None
    return window


def first_max_pool(x, window):
    """The max over non-overlapping ``window``s of ``x`` (a trailing remainder dropped, as XLA's VALID pooling
    does), whose derivative goes to the first maximum of each window in row-major order: XLA's
    ``select_and_scatter`` convention. Written as a selection by a mask from an ``argmax`` (an integer, so
    no derivative flows through it), its reverse pass is a product with that mask.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.nn.layers import first_max_pool
        >>> x = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 5.0, 5.0]])
        >>> first_max_pool(x, (2, 2))          # one window of 2 x 2 per column pair
        Array([[3., 5.]], dtype=float32)
        >>> jax.grad(lambda x: first_max_pool(x, (2, 2)).sum())(x)   # to the first maximum of each window
        Array([[0., 1., 0., 0.],
               [0., 0., 1., 0.]], dtype=float32)
    """
    out = tuple(s // w for s, w in zip(x.shape, window, strict=True))
    x = x[tuple(slice(0, o * w) for o, w in zip(out, window, strict=True))]
    x = x.reshape([d for o, w in zip(out, window, strict=True) for d in (o, w)])
    n = len(out)
    x = x.transpose([*range(0, 2 * n, 2), *range(1, 2 * n, 2)]).reshape(*out, -1)
    first = jnp.argmax(x, axis=-1, keepdims=True) == jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.sum(jnp.where(first, x, jnp.zeros((), x.dtype)), axis=-1)


def _inline_pool(eqn, invar, window, new_eqns):
    """Append `first_max_pool`'s equations for ``eqn`` (reading ``invar``) to ``new_eqns`` and return its output
    var; None (nothing appended) if its program needs constants."""
    aval = eqn.invars[0].aval
    sub = jax.make_jaxpr(lambda x: first_max_pool(x, window))(jax.ShapeDtypeStruct(aval.shape, aval.dtype))
    if sub.jaxpr.constvars:
        return None
    names = {sub.jaxpr.invars[0]: invar}
    for e in sub.jaxpr.eqns:
        new_eqns.append(jex.core.new_jaxpr_eqn([names.get(v, v) if _is_var(v) else v for v in e.invars],
                                               e.outvars, e.primitive, e.params, e.effects, e.source_info, e.ctx))
    return sub.jaxpr.outvars[0]


def tapped_layers(closed, num_leaves):
    """``(layers, tapped)`` for a traced per-example model ``closed`` whose first ``num_leaves`` inputs are the
    parameter leaves: ``tapped(*leaves, *x_leaves, *deltas) -> (*outputs, *activations)``."""
    jaxpr = closed.jaxpr
    leaf_vars = {v: i for i, v in enumerate(jaxpr.invars[:num_leaves])}
    uses, uses_of = {}, {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if _is_var(v):
                uses[v] = uses.get(v, 0) + 1
                uses_of.setdefault(v, []).append(eqn)
    for v in jaxpr.outvars:
        if _is_var(v):
            uses[v] = uses.get(v, 0) + 1  # an output counts as a use (but has no eqn)
    weights = _weight_views(jaxpr.eqns, leaf_vars, uses)
    found = {}  # eqn index -> (layer, activation var)
    for i, eqn in enumerate(jaxpr.eqns):
        match = {"dot_general": _dense, "conv_general_dilated": _conv}.get(eqn.primitive.name)
        hit = match(eqn, weights, uses) if match else None
        if hit is None:
            continue
        layer, a, channel = hit
        bias = _find_bias(jaxpr.eqns, eqn.outvars[0], channel, leaf_vars, uses, uses_of,
                          layer.groups * layer.num_out)
        found[i] = (layer._replace(bias=bias), a)
    layers, deltas, acts, rename, new_eqns = [], [], [], {}, []
    for i, eqn in enumerate(jaxpr.eqns):
        invars = [rename.get(v, v) if _is_var(v) else v for v in eqn.invars]
        window = _pool_window(eqn)
        pooled = None if window is None else _inline_pool(eqn, invars[0], window, new_eqns)
        if pooled is not None:
            rename[eqn.outvars[0]] = pooled
            continue
        new_eqns.append(jex.core.new_jaxpr_eqn(invars, eqn.outvars, eqn.primitive, eqn.params, eqn.effects,
                                               eqn.source_info, eqn.ctx))
        if i in found:
            layer, a = found[i]
            z = eqn.outvars[0]
            delta, perturbed = jex.core.Var(z.aval), jex.core.Var(z.aval)
            new_eqns.append(jex.core.new_jaxpr_eqn([z, delta], [perturbed], jax.lax.add_p, {}, jex.core.no_effects))
            rename[z] = perturbed
            deltas.append(delta)
            acts.append(rename.get(a, a))
            layers.append(layer)
    outvars = [rename.get(v, v) if _is_var(v) else v for v in jaxpr.outvars]
    invars = list(jaxpr.invars) + deltas
    info = jex.core.DebugInfo("linops.kfac", "the model with its layers tapped", (None,) * len(invars),
                              (None,) * (len(outvars) + len(acts)))
    new = jex.core.Jaxpr(jaxpr.constvars, invars, outvars + acts, new_eqns, jaxpr.effects, info)
    return layers, jex.core.jaxpr_as_fun(jex.core.ClosedJaxpr(new, closed.consts))


def kernel_leaves(fn, params, x) -> set[int]:
    """The parameter leaves (indices) that are an operand of a ``dot_general`` or a convolution in ``fn``'s program
    on one example ``x``, directly or through reshapes, casts and transposes: the kernels of the model's products,
    recognised as layers or not (a tied weight, a kernel whose contracted axes sit in its middle). `linops.kfac`
    warns about those of them in no recognised layer.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.nn.layers import kernel_leaves, trace_layers
        >>> fn = lambda p, x: p["W"].T @ jnp.tanh(p["W"] @ x) * p["s"]   # W tied (used twice), s a scale
        >>> params, x = {"W": jnp.ones((4, 3)), "s": jnp.ones(3)}, jnp.ones(3)
        >>> kernel_leaves(fn, params, x), trace_layers(fn, params, x)[0]   # a kernel, but no layer
        ({0}, [])
    """
    closed, leaves = _flat_program(fn, params, x)
    jaxpr = closed.jaxpr
    views = {v: i for i, v in enumerate(jaxpr.invars[: len(leaves)])}
    found = set()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("reshape", "convert_element_type", "transpose") and _is_var(eqn.invars[0]) \
                and eqn.invars[0] in views:
            views[eqn.outvars[0]] = views[eqn.invars[0]]
        elif name in ("dot_general", "conv_general_dilated"):
            found |= {views[v] for v in eqn.invars if _is_var(v) and v in views}
    return found


def trace_layers(fn, params, x):
    """``(layers, tapped, leaves)``: the recognised layers of ``fn`` on one example ``x``.

    ``layers``: a `Layer` per recognised layer, in the order the program runs them; ``tapped`` the model
    rewritten to expose them (`tapped_layers`); ``leaves`` the parameter leaves
    (``jax.tree_util.tree_leaves(params)``, the indices ``Layer.weight`` and ``Layer.bias`` refer to). The
    model's own jitted calls are inlined so that their layers are seen.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.nn.layers import trace_layers
        >>> fn = lambda p, x: jnp.tanh(p["W"] @ x + p["b"])          # a dense layer, output index first
        >>> params = {"W": jnp.ones((4, 3)), "b": jnp.zeros(4)}
        >>> layers, _, leaves = trace_layers(fn, params, jnp.ones(3))
        >>> [(L.weight, L.bias, L.out_first, L.num_in, L.num_out) for L in layers]
        [(0, 1, True, 3, 4)]
        >>> layers[0].acts(jnp.arange(3.0)).shape                    # (groups, in, positions)
        (1, 3, 1)
    """
    def build():
        closed, leaves = _flat_program(fn, params, x)
        return tapped_layers(closed, len(leaves))

    layers, tapped = memo("layers", fn, (params, x), build)  # once per model and shapes
    return layers, tapped, jax.tree_util.tree_leaves(params)


def _flat_program(fn, params, x):
    """``(closed jaxpr, leaves)``: ``fn`` on one example traced with the parameter leaves, then the example's, as
    its inputs; the model's own jitted calls inlined, so that their layers are seen."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    x_leaves, x_tree = jax.tree_util.tree_flatten(x)

    def flat_fn(*args):
        return fn(jax.tree_util.tree_unflatten(treedef, args[: len(leaves)]),
                  jax.tree_util.tree_unflatten(x_tree, args[len(leaves):]))

    def build():
        with jax.disable_jit():
            return jax.make_jaxpr(flat_fn)(*leaves, *x_leaves)

    return memo("program", fn, (params, x), build), leaves


def tapped_vjp(layers, tapped, leaves, others, x):
    """``(outputs, vjp, activations)`` of one example ``x``: ``vjp(row)`` gives the row's gradients at every
    layer's output and at the leaves ``others`` (indices of the leaves in no layer), as two lists; the
    activations are the layers' raw inputs (`Layer.acts` makes columns of them).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.nn.layers import tapped_vjp, trace_layers
        >>> fn = lambda p, x: p["W"] @ x                              # one dense layer: J = I (x) x^T
        >>> params, x = {"W": jnp.ones((2, 3))}, jnp.array([1.0, 2.0, 3.0])
        >>> layers, tapped, leaves = trace_layers(fn, params, x)
        >>> out, vjp, acts = tapped_vjp(layers, tapped, leaves, [], x)
        >>> (g,), _ = vjp(jnp.array([0.0, 1.0]))                      # output 1 at the layer's output
        >>> g, acts[0]                                                # its row of J is g (x) x
        (Array([0., 1.], dtype=float32), Array([1., 2., 3.], dtype=float32))
    """
    xs = jax.tree_util.tree_leaves(x)
    deltas = [jnp.zeros(L.out_aval.shape, L.out_aval.dtype) for L in layers]

    def f(ds, free):
        full = list(leaves)
        for i, leaf in zip(others, free, strict=True):
            full[i] = leaf
        out = tapped(*full, *xs, *ds)
        return out[0], out[1:]

    return jax.vjp(f, deltas, [leaves[i] for i in others], has_aux=True)


__all__ = ["Layer", "conv_patches", "first_max_pool", "kernel_leaves", "tapped_vjp", "trace_layers"]
