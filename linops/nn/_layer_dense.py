r"""The dense GGN of a model whose every parameter sits in a dense layer on a vector, by Kronecker blocks.

For such a layer $s = W a$ (one position) the rows of $A_n J_n$ with respect to $W$ are
$g_{n,k} \otimes a_n$ ($g_{n,k}$ row $k$'s gradient at the layer's output, `linops.nn.layers`),
and a bias's are $g_{n,k}$ (its activation is the constant 1). The GGN block of leaves $i, j$ is then
exactly

$$\sum_n \big(G_{n,i}^\top G_{n,j}\big) \otimes \big(a_{n,i} a_{n,j}^\top\big), \qquad
G_{n,i} = [g_{n,1}; \dots; g_{n,K}] \in \mathbb R^{K \times \text{out}_i},$$

one matrix product over the examples per pair of leaves (of the terms
$\operatorname{vec}(G_{n,i}^\top G_{n,j}) \otimes a_{n,i}$ with $a_{n,j}$, the narrower input
first): $N P^2$ multiply-adds in all, where the product of the $NK$ Jacobian rows costs $N K P^2$.
It is no approximation (unlike KFAC, nothing is factored across examples).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.nn.layers import tapped_vjp
from linops.runtime._batching import sharded_sum

_BUDGET = 1 << 25  # numbers of one pair's per-example terms held at once per batch


def dense_only(plan) -> bool:
    """Whether every leaf of a `layer_plan` is the weight or bias of a dense layer on a vector (no leaf in no
    layer, one position, one group): the case `layer_dense_ggn` handles."""
    layers, _, _, others = plan
    return not others and all(L.positions == 1 and L.groups == 1 and L.in_perm is None for L in layers)


def _pieces(layers, num_leaves):
    """Per leaf ``(layer index, is bias)``."""
    pieces = [None] * num_leaves
    for k, L in enumerate(layers):
        pieces[L.weight] = (k, False)
        if L.bias is not None:
            pieces[L.bias] = (k, True)
    return pieces


def _axes(L, is_bias, out_axis, in_axis):
    """The axes of a leaf's row-major index among a pair's ``(out_i, out_j, in_i, in_j)`` block axes."""
    if is_bias:
        return [out_axis, in_axis]  # in = 1
    return [out_axis, in_axis] if L.out_first else [in_axis, out_axis]


def _pairs(plan):
    """``(pieces, n_in, n_out, pairs)``: each pair ``(s, t)`` of leaves with the narrower input first."""
    layers, _, leaves, _ = plan
    pieces = _pieces(layers, len(leaves))
    n_in = [1 if bias else layers[k].num_in for k, bias in pieces]
    n_out = [layers[k].num_out for k, _ in pieces]
    pairs = [(i, j) if n_in[i] <= n_in[j] else (j, i) for i in range(len(leaves)) for j in range(i, len(leaves))]
    return pieces, n_in, n_out, pairs


def dense_chunk(plan, batch_size) -> int:
    """Examples per batch of `layer_dense_ggn`: a pair's terms ``(b, out_s out_t in_s)`` stay near the budget."""
    _, n_in, n_out, pairs = _pairs(plan)
    widest = max(n_out[s] * n_out[t] * (n_in[s] + 1) + n_in[t] for s, t in pairs)
    return max(1, min(batch_size, _BUDGET // widest))


def layer_dense_ggn(plan, likelihood, inputs, targets, chunk, mesh, axis, progress=None, per_example=None):
    """The exact dense GGN (``P x P``, the leaf order of ``ravel``) of a `dense_only` plan, ``chunk`` examples
    per batch. With ``per_example(f_n, y_n, lik_n)`` (``lik_n`` None unless the likelihood is per example):
    ``(GGN, its sum over the examples)``, from the outputs of the same forward pass."""
    layers, tapped, leaves, _ = plan
    pieces, n_in, n_out, pairs = _pairs(plan)
    sizes = [int(np.size(leaf)) for leaf in leaves]
    # per pair and batch the terms D = vec(B) (x) a_s, (b, out_s out_t in_s), times a_t over the examples: one
    # matrix product whose contraction is the batch

    def example(x, y, lik_n):
        f_n, vjp, acts = tapped_vjp(layers, tapped, leaves, (), x)
        A = (likelihood if lik_n is None else lik_n).hessian_factor(f_n, y)  # (K, O)
        grads, _ = jax.vmap(vjp)(A)
        return ([jax.vmap(L.grads)(g)[:, 0, :, 0] for L, g in zip(layers, grads, strict=True)],  # (K, out)
                [L.acts(a)[0, :, 0] for L, a in zip(layers, acts, strict=True)],  # (in,)
                None if per_example is None else per_example(f_n, y, lik_n))

    def batch(data):
        xb, yb, lb = data
        gs, acts, terms = jax.vmap(example, in_axes=(0, 0, 0 if lb is not None else None))(xb, yb, lb)
        b = jax.tree_util.tree_leaves(xb)[0].shape[0]
        ones = jnp.ones((b, 1), gs[0].dtype)
        a = [ones if bias else acts[k] for k, bias in pieces]
        blocks = []
        for s, t in pairs:
            B = jnp.einsum("bko,bkp->bop", gs[pieces[s][0]], gs[pieces[t][0]])  # (b, out_s, out_t)
            D = (B[:, :, :, None] * a[s][:, None, None, :]).reshape(b, -1)  # (b, out_s out_t in_s)
            blocks.append(D.T @ a[t])  # (out_s out_t in_s, in_t)
        return blocks, jax.tree_util.tree_map(lambda v: jnp.sum(v, axis=0), terms)

    lik = likelihood if likelihood.per_example else None
    blocks, sums = sharded_sum(batch, (inputs, targets, lik), chunk, mesh, axis, progress)
    rows = [[None] * len(leaves) for _ in leaves]
    for (s, t), M in zip(pairs, blocks, strict=True):
        (ls, bs), (lt, bt) = pieces[s], pieces[t]
        M = M.reshape(n_out[s], n_out[t], n_in[s], n_in[t])
        perm = _axes(layers[ls], bs, 0, 2) + _axes(layers[lt], bt, 1, 3)
        M = jnp.transpose(M, perm).reshape(sizes[s], sizes[t])
        rows[s][t], rows[t][s] = M, M.T
    G = jnp.block(rows).astype(jnp.result_type(*leaves))
    return G if per_example is None else (G, sums)
