r"""The exact GGN diagonal per recognised layer, without per-example gradients of the whole network.

Example $n$ adds $\sum_k (\partial (A_n f_n)_k / \partial\theta)^2$ to the diagonal ($A_n$ the
likelihood's Hessian factor, $K$ rows). For a layer $s_r = W a_r$ found in the model's program
(`linops.nn.layers`), the gradient of row $k$ with respect to $W$ is
$\sum_r g_{n,r,k}\, a_{n,r}^\top$, with $g_{n,r,k}$ the row's gradient at the layer's output
(one reverse pass to the layer outputs, not to the weights). So:

- **one position** ($R = 1$, a dense layer on a vector): the diagonal block is
  $\sum_n \big(\sum_k g_{n,k}^{\,2}\big) (a_n^{2})^\top$: one matrix product per batch, and no
  per-example gradient is ever formed (the rule BackPACK uses);
- **shared positions** (a convolution's pixels, a dense layer's tokens): the per-row gradient
  $\sum_r g_{n,r,k} a_{n,r}^\top$ of that layer alone, squared;
- a **bias**: $\sum_{n,k} (\sum_r g_{n,r,k})^2$ (with shared positions, from the kernel's product with a
  column of ones appended to the activations: the output gradients have one consumer);
- every other leaf (norm scales, embeddings, weights used twice): its own reverse pass, squared.

All are exact: the result equals the diagonal from whole-network per-example gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops.nn.layers import tapped_vjp, trace_layers
from linops.runtime._batching import sharded_sum

_BUDGET = 1 << 25  # numbers held at once per batch (128 MB in float32)


def layer_plan(fn, params, x):
    """``(layers, tapped, leaves, others)`` of ``fn`` on one example, or None when it has no recognised layer."""
    layers, tapped, leaves = trace_layers(fn, params, x)
    if not layers:
        return None
    used = {L.weight for L in layers} | {L.bias for L in layers if L.bias is not None}
    return layers, tapped, leaves, tuple(i for i in range(len(leaves)) if i not in used)


def _row_numbers(layers, leaves, others):
    """Numbers alive per row of the Hessian factor: output gradients, a shared layer's row gradient, others."""
    n = sum(L.positions * L.groups * L.num_out for L in layers)
    n += sum(L.groups * L.num_out * L.num_in for L in layers if L.positions > 1)
    return n + sum(int(np.size(leaves[i])) for i in others)


def _example_fn(plan, likelihood, num_rows, per_block, per_example=None):
    """``(x, y, lik_n) -> per-example terms``: for each layer the squared output gradients summed over the rows
    (one position) or the squared row gradients (shared positions), the bias terms and the other leaves'; and
    ``per_example(f_n, y, lik_n)`` of the example's outputs (None without it)."""
    layers, tapped, leaves, others = plan
    num_blocks = -(-num_rows // per_block)

    def example(x, y, lik_n):
        f_n, vjp, raw_acts = tapped_vjp(layers, tapped, leaves, others, x)
        acts = [L.acts(a) for L, a in zip(layers, raw_acts, strict=True)]  # (G, in, R)
        A = (lik_n if lik_n is not None else likelihood).hessian_factor(f_n, y)  # (K, O)

        def squares(Ab):  # the terms of a block of rows of A
            d_grads, o_grads = jax.vmap(vjp)(Ab)
            weights, biases = [], []
            for L, a, g in zip(layers, acts, d_grads, strict=True):
                g = jax.vmap(L.grads)(g)  # (k, G, out, R)
                if L.positions == 1:
                    weights.append(jnp.sum(g[..., 0] ** 2, axis=0))  # (G, out); times a^2 per batch
                    biases.append(weights[-1] if L.bias is not None else None)  # one position: sum_k g^2 too
                    continue
                # the rows' gradients, a matrix product over the positions (the minor axis of both); with a bias,
                # a row of ones appended to the patches gives its gradient (the sum over the positions) from the
                # same product, so g has one consumer (XLA otherwise computes g twice: issue 32's profile)
                if L.bias is not None:
                    a = jnp.concatenate([a, jnp.ones_like(a[:, :1])], axis=1)
                rows = jnp.sum(jnp.einsum("kgor,gir->kgoi", g, a) ** 2, axis=0)  # (G, out, in [+ 1])
                weights.append(rows[..., :L.num_in] if L.bias is not None else rows)
                biases.append(rows[..., L.num_in] if L.bias is not None else None)
            return weights, biases, [jnp.sum(o**2, axis=0) for o in o_grads]

        if num_blocks == 1:
            terms = squares(A)
        else:
            padded = jnp.pad(A, ((0, num_blocks * per_block - A.shape[0]), (0, 0)))
            blocks = padded.reshape(num_blocks, per_block, -1)
            zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(squares, blocks[0]))
            terms = lax.scan(lambda acc, Ab: (jax.tree_util.tree_map(jnp.add, acc, squares(Ab)), None), zero,
                             blocks)[0]
        squared_acts = [a[..., 0] ** 2 if L.positions == 1 else None for L, a in zip(layers, acts, strict=True)]
        return terms, squared_acts, None if per_example is None else per_example(f_n, y, lik_n)

    return example


def layer_diag(plan, likelihood, inputs, targets, num_rows, batch_size, mesh, axis, progress=None, per_example=None):
    """The exact GGN diagonal as a flat vector (leaf order of ``ravel``), from a `layer_plan`; with
    ``per_example(f_n, y_n, lik_n)``: ``(diagonal, its sum over the examples)``, from the same forward passes."""
    layers, _, leaves, others = plan
    per_row = _row_numbers(layers, leaves, others)
    per_block = max(1, min(num_rows, _BUDGET // max(per_row, 1)))
    P = sum(int(np.size(leaf)) for leaf in leaves)
    chunk = max(1, min(batch_size, _BUDGET // (per_block * per_row + P)))
    example = _example_fn(plan, likelihood, num_rows, per_block, per_example)
    lik = likelihood if likelihood.per_example else None

    def batch(data):
        xb, yb, lb = data
        (weights, biases, rest), sq_acts, extra = jax.vmap(example, in_axes=(0, 0, 0 if lb is not None else None))(
            xb, yb, lb)
        weights = [jnp.einsum("bgo,bgi->goi", w, a2) if L.positions == 1 else jnp.sum(w, axis=0)
                   for L, w, a2 in zip(layers, weights, sq_acts, strict=True)]
        return (weights, [None if b is None else jnp.sum(b, axis=0) for b in biases],
                [jnp.sum(r, axis=0) for r in rest], jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), extra))

    weights, biases, rest, sums = sharded_sum(batch, (inputs, targets, lik), chunk, mesh, axis, progress)
    per_leaf = [None] * len(leaves)
    for L, w, b in zip(layers, weights, biases, strict=True):  # w: (G, out, in) in patch order
        if L.in_perm is not None:
            w = w[..., L.in_perm]
        w = w.reshape(L.groups * L.num_out, L.num_in)
        shape = np.shape(leaves[L.weight])
        per_leaf[L.weight] = (w if L.out_first else w.T).reshape(shape)
        if L.bias is not None:
            per_leaf[L.bias] = b.reshape(np.shape(leaves[L.bias]))
    for i, r in zip(others, rest, strict=True):
        per_leaf[i] = r
    diagonal = jnp.concatenate([jnp.ravel(d).astype(jnp.result_type(leaves[i])) for i, d in enumerate(per_leaf)])
    return diagonal if per_example is None else (diagonal, sums)
