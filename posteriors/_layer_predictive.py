r"""Linearised variances of the KFAC and diagonal posteriors from per-layer quadratic forms, never a Jacobian row.

For a layer $s_r = W a_r$ the Jacobian row of output $o$ with respect to $W$ is
$\sum_r g_{o,r} a_r^\top$ (``out x in``), $g_{o,r}$ the output's gradient at the layer's output, so
one forward pass per input (which gives every activation) and one reverse pass per output *to the
layer outputs* give every row without forming it over all $P$ parameters.

- **KFAC**: in the eigenbases $Q_B, Q_A$ of the Kronecker factors the row is
  $T_o = (Q_B^\top G_o)(A Q_A)$ with $G_o$ the ``(out, R)`` gradients and $A$ the ``(R, in)``
  activations, and the variance contribution is $\sum_{ij} T_{o,ij}^2 / (w_{B,i} w_{A,j}/s + \alpha)$.
  For one position ($R = 1$) $T_o$ is the outer product of $Q_B^\top g_o$ and $Q_A^\top a$:
  $O(\text{out}^2 + \text{in}^2 + \text{out}\cdot\text{in})$ per row, where the covariance's product
  with a dense row costs $O(\text{out}\cdot\text{in}\,(\text{out} + \text{in}))$.
- **diagonal**: the same with $Q = I$ and the covariance's diagonal $D$: for one position
  $(g_o^{2})^\top D\, (a^{2})$, an $O(\text{out}\cdot\text{in})$ form per output.

A bias adds $\|\hat g_o\|^2$ weighted in its block ($\hat g_o = \sum_r g_{o,r}$); a leaf in no
recognised layer its own gradient's squares weighted by its diagonal covariance (both structures
give such leaves an exact diagonal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops.nn.layers import tapped_vjp
from linops.nn.layers import trace_layers as _trace
from linops.runtime import batched_map, program


def _moments(fn, params, inputs, batch, weight_term, leaf_variance, progress=None):
    """``(means, variances)``, each ``(M, O)``: per input, the forward pass (the mean) and the reverse passes of
    every output to the layer outputs and the other leaves; ``weight_term(L, a, g)`` gives a layer's contribution
    per output, ``leaf_variance(i)`` the diagonal covariance of leaf ``i`` in no layer."""
    layers, tapped, leaves = _trace(fn, params, jax.tree_util.tree_map(lambda a: a[0], inputs))
    used = {L.weight for L in layers} | {L.bias for L in layers if L.bias is not None}
    others = [i for i in range(len(leaves)) if i not in used]

    def example(x):
        out, vjp, acts = tapped_vjp(layers, tapped, leaves, others, x)
        E = jnp.eye(out.shape[0], dtype=out.dtype)
        grads, other_grads = jax.vmap(vjp)(E)  # per layer (O, *output shape); per other leaf (O, *shape)
        total = jnp.zeros(out.shape[0], out.dtype)
        for L, a, g in zip(layers, acts, grads, strict=True):
            total = total + weight_term(L, L.acts(a), jax.vmap(L.grads)(g))
        for i, g in zip(others, other_grads, strict=True):
            total = total + jnp.sum(g.reshape(g.shape[0], -1) ** 2 * leaf_variance(i).reshape(-1)[None], axis=1)
        return out, total

    n = jax.tree_util.tree_leaves(inputs)[0].shape[0]
    return batched_map(jax.vmap(example), inputs, max(1, min(n, batch)), progress)


def _in_kernel_order(L, a):
    """``a`` ``(G, in, R)`` in the kernel's row-major order of the input index."""
    return a if L.in_perm is None else a[:, np.asarray(L.in_perm)]


@program
def kfac_moments(post, inputs, batch: int, progress: str | None = None) -> tuple[jax.Array, jax.Array]:
    """``(means, variances)``, each ``(M, O)``: the MAP outputs and $\\operatorname{diag}(J \\Sigma J^\\top)$ of a
    KFAC `LaplacePosterior`, ``batch`` inputs at a time (`jax.lax.scan`); one compiled program per posterior
    structure, model and shapes."""
    ggn = post.ggn
    alphas = ggn._leaf_alpha(post.prior_precision)

    def inverse_eigenvalues(i):
        return 1.0 / (ggn.eigenvalues[i] / post.noise_scale + alphas[i])

    def weight_term(L, a, g):
        total = jnp.zeros(g.shape[0], g.dtype)
        if L.bias is not None:
            (Q,) = ggn.eigenvectors[L.bias]
            total = total + jnp.sum((g.sum(-1).reshape(g.shape[0], -1) @ Q) ** 2 * inverse_eigenvalues(L.bias)[None],
                                    axis=1)
        a = _in_kernel_order(L, a)  # (G, in, R); g: (O, G, out, R)
        vectors, D = ggn.eigenvectors[L.weight], inverse_eigenvalues(L.weight)
        if L.groups == 1:
            vectors = tuple(V[None] for V in vectors)
        Q_out, Q_in = vectors if L.out_first else vectors[::-1]  # (G, out, out), (G, in, in)
        D = D.reshape(L.groups, *((L.num_out, L.num_in) if L.out_first else (L.num_in, L.num_out)))
        if not L.out_first:
            D = jnp.swapaxes(D, 1, 2)  # (G, out, in)
        u = jnp.einsum("ogkr,gkl->oglr", g, Q_out)  # gradients in the output eigenbasis
        v = jnp.einsum("gir,gij->gjr", a, Q_in)  # activations in the input eigenbasis
        if a.shape[-1] == 1:  # one position: T_o is an outer product
            return total + jnp.einsum("ogl,glj,gj->o", u[..., 0] ** 2, D, v[..., 0] ** 2)
        T = jnp.einsum("oglr,gjr->oglj", u, v)
        return total + jnp.einsum("oglj,glj->o", T**2, D)

    return _moments(post.fn, post.params, inputs, batch, weight_term, inverse_eigenvalues, progress)


@program
def diag_moments(post, inputs, batch: int, progress: str | None = None) -> tuple[jax.Array, jax.Array]:
    """``(means, variances)``, each ``(M, O)``: the MAP outputs and $\\operatorname{diag}(J \\Sigma J^\\top)$ of a
    diagonal `LaplacePosterior` (``Σ`` diagonal), ``batch`` inputs at a time; one compiled program per posterior
    structure, model and shapes."""
    variance = 1.0 / (post.ggn.g / post.noise_scale + post.prior_precision)  # (P,)
    per_leaf = jax.tree_util.tree_leaves(post.unravel(variance))

    def bias_term(L, summed):  # summed: (O, G, out), the output gradients summed over the positions
        return jnp.sum(summed.reshape(summed.shape[0], -1) ** 2 * per_leaf[L.bias].reshape(-1)[None], axis=1)

    def weight_term(L, a, g):
        a = _in_kernel_order(L, a)  # (G, in, R); g: (O, G, out, R)
        D = per_leaf[L.weight]
        D = (D.reshape(L.groups, L.num_out, L.num_in) if L.out_first
             else D.reshape(L.num_in, L.num_out).T[None])  # (G, out, in)
        if a.shape[-1] == 1:  # one position: the row is an outer product, its weighted squares a bilinear form
            total = jnp.einsum("ogl,glj,gj->o", g[..., 0] ** 2, D, a[..., 0] ** 2)
            return total if L.bias is None else total + bias_term(L, g[..., 0])
        if L.bias is None:
            return jnp.einsum("oglj,glj->o", jnp.einsum("oglr,gjr->oglj", g, a) ** 2, D)
        # the bias's sum over the positions from the same product, a column of ones appended to the activations:
        # g has one consumer (XLA otherwise computes it twice, as in linops.nn._layer_diag)
        T = jnp.einsum("oglr,gjr->oglj", g, jnp.concatenate([a, jnp.ones_like(a[:, :1])], axis=1))
        return jnp.einsum("oglj,glj->o", T[..., :-1] ** 2, D) + bias_term(L, T[..., -1])

    return _moments(post.fn, post.params, inputs, batch, weight_term, lambda i: per_leaf[i], progress)
