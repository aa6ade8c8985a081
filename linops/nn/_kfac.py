r"""Kronecker-factored curvature (KFAC) of the GGN for the dense layers of any per-example model.

A dense layer is found in the model's traced program as a ``dot_general`` between a 2-D
parameter leaf $W$ and a 1-D activation $a$ (``W @ a`` or ``a @ W``), optionally followed by
an ``add`` of a 1-D parameter leaf (its bias). The program is rewritten to add a zero
perturbation $\delta$ to each such product and to return the activations, so that one
forward pass gives every $a$, and one vector-Jacobian product per row of the likelihood's
Hessian factor $A_n$ gives every $g = \partial (A_n f)_r / \partial \delta$. Then

$$G_W = \sum_n \Big(\sum_r g_{nr} g_{nr}^\top\Big) \otimes a_n a_n^\top
\approx \Big(\sum_n \sum_r g_{nr} g_{nr}^\top\Big) \otimes \frac1N \sum_n a_n a_n^\top
= B \otimes A$$

in the weight's row-major order (``W`` of shape ``(out, in)``; the factors swap for
``(in, out)``), and the bias block $\sum_n \sum_r g_{nr} g_{nr}^\top = B$ is exact. Weight and
bias are separate blocks (their cross-covariance is dropped, as in block-diagonal KFAC).
The approximation is exact when $B_n$ does not vary over the examples (a linear model with a
Gaussian likelihood).
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

from linops._batching import check_mesh, num_examples, sharded_sum
from linops.nn._operators import _check_batch_size, _check_likelihood, _check_model
from linops.nn.likelihoods import Likelihood


class _Layer(eqx.Module):
    weight: int = eqx.field(static=True)  # leaf index
    bias: int | None = eqx.field(static=True)
    weight_first: bool = eqx.field(static=True)  # W is (out, in): G ~ B (x) A; else A (x) B


def _dense_layers(closed, num_leaves):
    """``(layers, tapped)``: the dense layers of a traced per-example model and its rewritten program.

    ``tapped(*leaves, *x_leaves, *deltas) -> (*outputs, *activations)``.
    """
    jaxpr = closed.jaxpr
    leaf_vars = {v: i for i, v in enumerate(jaxpr.invars[:num_leaves])}
    uses = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jex.core.Var) and v in leaf_vars:
                uses[v] = uses.get(v, 0) + 1
    found = []  # (eqn index, weight leaf, weight_first, activation var, output var)
    for i, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "dot_general":
            continue
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        if lb or rb:
            continue
        lhs, rhs = eqn.invars
        for w, a, wc in ((lhs, rhs, lc), (rhs, lhs, rc)):
            if (isinstance(w, jex.core.Var) and w in leaf_vars and w.aval.ndim == 2 and isinstance(a, jex.core.Var)
                    and a.aval.ndim == 1 and uses[w] == 1):
                # contracting W's axis 1 means W is (out, in) and its row-major order is (out, in)
                found.append((i, leaf_vars[w], tuple(wc) == (1,), a, eqn.outvars[0]))
                break
    layers, deltas, acts, rename = [], [], [], {}
    new_eqns = []
    by_eqn = {f[0]: f for f in found}
    outputs = {f[4] for f in found}
    bias_of = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "add":
            x, y = eqn.invars
            for z, b in ((x, y), (y, x)):
                if (isinstance(z, jex.core.Var) and z in outputs and isinstance(b, jex.core.Var) and b in leaf_vars
                        and b.aval.ndim == 1 and b.aval.shape == z.aval.shape):
                    bias_of[z] = leaf_vars[b]
    for i, eqn in enumerate(jaxpr.eqns):
        invars = [rename.get(v, v) if isinstance(v, jex.core.Var) else v for v in eqn.invars]
        new_eqns.append(jex.core.new_jaxpr_eqn(invars, eqn.outvars, eqn.primitive, eqn.params, eqn.effects,
                                               eqn.source_info, eqn.ctx))
        if i in by_eqn:
            _, leaf, weight_first, a, z = by_eqn[i]
            delta, perturbed = jex.core.Var(z.aval), jex.core.Var(z.aval)
            new_eqns.append(jex.core.new_jaxpr_eqn([z, delta], [perturbed], jax.lax.add_p, {}, jex.core.no_effects))
            rename[z] = perturbed
            deltas.append(delta)
            acts.append(rename.get(a, a))
            layers.append(_Layer(leaf, bias_of.get(z), weight_first))
    outvars = [rename.get(v, v) if isinstance(v, jex.core.Var) else v for v in jaxpr.outvars]
    invars = list(jaxpr.invars) + deltas
    info = jex.core.DebugInfo("linops.kfac", "the model with its dense layers tapped", (None,) * len(invars),
                              (None,) * (len(outvars) + len(acts)))
    new = jex.core.Jaxpr(jaxpr.constvars, invars, outvars + acts, new_eqns, jaxpr.effects, info)
    closed_new = jex.core.ClosedJaxpr(new, closed.consts)
    return layers, jex.core.jaxpr_as_fun(closed_new)


class KFAC(eqx.Module):
    r"""Kronecker factors of the GGN per dense layer, from `linops.kfac`.

    Attributes:
        factors: per dense layer, ``(first, second)`` with $G_W \approx$ ``first`` $\otimes$
            ``second`` in the weight's row-major order.
        bias_blocks: per dense layer, the exact bias block $B$ (None without a bias).
        weight_leaves, bias_leaves: the layers' leaf indices in ``jax.tree_util.tree_leaves(params)``.
        other_leaves: leaf indices that belong to no dense layer (KFAC has no block for them).
        leaf_sizes: the number of parameters of every leaf, in order.
        num_examples: $N$.
    """

    factors: tuple
    bias_blocks: tuple
    weight_leaves: tuple = eqx.field(static=True)
    bias_leaves: tuple = eqx.field(static=True)
    other_leaves: tuple = eqx.field(static=True)
    leaf_sizes: tuple = eqx.field(static=True)
    num_examples: int = eqx.field(static=True)


def kfac(fn: Callable, params, inputs, targets, likelihood: Likelihood, *, batch_size: int | None = None,
         mesh=None, axis: str = "data") -> KFAC:
    r"""KFAC factors of the GGN of ``fn`` at ``params`` over the data: one pass over the batches.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; its dense layers are found in its
            traced program (see the module docs).
        params: the params pytree.
        inputs: inputs with a leading example axis ``N`` (one array).
        targets: targets with a leading example axis.
        likelihood: a `linops.likelihoods.Likelihood` (its Hessian factor gives the rows).
        batch_size: examples per batch (default all; the short last batch counts).
        mesh: a `jax.sharding.Mesh` to split the examples over: each device sums the factors of its
            share and the partial sums are ``psum``-reduced (as for `GGNOp`); None: one device.
        axis: the mesh axis the examples are split along (default ``"data"``).

    Example:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> fn = lambda p, x: p["W"] @ x + p["b"]           # a dense layer, (out, in) = (2, 3)
        >>> p = {"W": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
        >>> X = jnp.eye(3); Y = jnp.zeros((3, 2))
        >>> K = lo.kfac(fn, p, X, Y, lo.likelihoods.Gaussian(1.0))
        >>> B, A = K.factors[0]                        # B = N I / sigma^2, A = X^T X / N
        >>> B, 3 * A
        (Array([[3., 0.],
               [0., 3.]], dtype=float32), Array([[1., 0., 0.],
               [0., 1., 0.],
               [0., 0., 1.]], dtype=float32))
    """
    who = "kfac"
    _check_batch_size(batch_size, who)
    mesh, axis = check_mesh(mesh, axis, who)
    n, _ = _check_model(fn, params, inputs, who)
    _check_likelihood(likelihood, who)
    if num_examples(targets) != n:
        raise ValueError(f"{who}: inputs has {n} examples but targets has {num_examples(targets)}")
    likelihood.check(jax.eval_shape(fn, params, jax.tree_util.tree_map(lambda a: a[0], inputs)).shape[0], targets, n,
                     who)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    x0 = jax.tree_util.tree_map(lambda a: a[0], inputs)
    x_leaves, x_tree = jax.tree_util.tree_flatten(x0)

    def flat_fn(*args):
        p = jax.tree_util.tree_unflatten(treedef, args[: len(leaves)])
        return fn(p, jax.tree_util.tree_unflatten(x_tree, args[len(leaves):]))

    closed = jax.make_jaxpr(flat_fn)(*leaves, *x_leaves)
    layers, tapped = _dense_layers(closed, len(leaves))
    if not layers:
        raise ValueError(f"{who}: found no dense layer (a product of a 2-D parameter with a 1-D activation) in "
                         "fn's program; KFAC needs at least one")
    # the output size of each layer: W is (out, in) when weight_first, else (in, out)
    shapes = [jax.ShapeDtypeStruct((leaves[L.weight].shape[0 if L.weight_first else 1],), leaves[L.weight].dtype)
              for L in layers]
    lik = likelihood if likelihood.per_example else None

    def example(x, y, lik_n):
        xs = jax.tree_util.tree_leaves(x)
        deltas = [jnp.zeros(s.shape, s.dtype) for s in shapes]

        def f(ds):
            out = tapped(*leaves, *xs, *ds)
            return out[0], out[1:]

        f_n, vjp, acts = jax.vjp(f, deltas, has_aux=True)
        A_n = (lik_n if lik_n is not None else likelihood).hessian_factor(f_n, y)  # (K, O)
        grads = jax.vmap(lambda r: vjp(r)[0])(A_n)  # per layer (K, out)
        return [g.T @ g for g in grads], [jnp.outer(a, a) for a in acts]

    def batch(data):
        xb, yb, lb = data
        Bs, As = jax.vmap(example, in_axes=(0, 0, 0 if lb is not None else None))(xb, yb, lb)
        return [b.sum(0) for b in Bs], [a.sum(0) for a in As]

    Bs, As = sharded_sum(batch, (inputs, targets, lik), n if batch_size is None else batch_size, mesh, axis)
    factors = tuple((B, A / n) if L.weight_first else (A / n, B) for L, A, B in zip(layers, As, Bs, strict=True))
    bias_blocks = tuple(B if L.bias is not None else None for L, B in zip(layers, Bs, strict=True))
    used = {L.weight for L in layers} | {L.bias for L in layers if L.bias is not None}
    return KFAC(factors, bias_blocks, tuple(L.weight for L in layers), tuple(L.bias for L in layers),
                tuple(i for i in range(len(leaves)) if i not in used), tuple(int(np.size(leaf)) for leaf in leaves), n)


__all__ = ["KFAC", "kfac"]
