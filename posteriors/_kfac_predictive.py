r"""The KFAC posterior's linearised variances from per-layer Kronecker quadratic forms, never a Jacobian row.

For a layer $s_r = W a_r$ the Jacobian row of output $o$ with respect to $W$ is
$\sum_r g_{o,r} a_r^\top$ (``out x in``), $g_{o,r}$ the output's gradient at the layer's output. In the
eigenbases $Q_B, Q_A$ of the Kronecker factors it is $T_o = (Q_B^\top G_o)(A Q_A)$ with $G_o$ the
``(out, R)`` gradients and $A$ the ``(R, in)`` activations, and the variance contribution is
$\sum_{ij} T_{o,ij}^2 / (w_{B,i} w_{A,j}/s + \alpha)$. For one position ($R = 1$) $T_o$ is the outer
product of $Q_B^\top g_o$ and $Q_A^\top a$: $O(\text{out}^2 + \text{in}^2 + \text{out}\cdot\text{in})$ per
row, where the covariance's product with a dense row costs $O(\text{out}\cdot\text{in}\,(\text{out} +
\text{in}))$. A bias adds $\|(Q^\top \hat g_o)\|^2_{D}$ with $\hat g_o = \sum_r g_{o,r}$; a leaf in no
recognised layer its Jacobian row's squares weighted by its diagonal covariance. One forward pass per
input (which also gives every activation) and one reverse pass per output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linops._batching import batched_map
from linops.nn._kfac import _trace


def kfac_variances(post, inputs, batch: int) -> jax.Array:
    """``(M, O)``: $\\operatorname{diag}(J \\Sigma J^\\top)$ of a KFAC `LaplacePosterior`, ``batch`` inputs at a
    time (`jax.lax.map`)."""
    ggn = post.ggn
    layers, tapped, leaves = _trace(post.fn, post.params, inputs[0])
    by_weight = {L.weight: L for L in layers}
    biases = {L.bias for L in layers if L.bias is not None}
    others = [i for i in range(len(leaves)) if i not in by_weight and i not in biases]
    alphas = ggn._leaf_alpha(post.prior_precision)
    scale = post.noise_scale

    def inverse_eigenvalues(i):
        return 1.0 / (ggn.eigenvalues[i] / scale + alphas[i])

    def example(x):
        xs = jax.tree_util.tree_leaves(x)
        deltas = [jnp.zeros(L.out_aval.shape, L.out_aval.dtype) for L in layers]

        def f(ds, other):
            full = list(leaves)
            for i, leaf in zip(others, other, strict=True):
                full[i] = leaf
            out = tapped(*full, *xs, *ds)
            return out[0], out[1:]

        out, vjp, acts = jax.vjp(f, deltas, [leaves[i] for i in others], has_aux=True)
        E = jnp.eye(out.shape[0], dtype=out.dtype)
        grads, other_grads = jax.vmap(vjp)(E)  # per layer (O, *output shape); per other leaf (O, *shape)
        total = jnp.zeros(out.shape[0], out.dtype)
        for L, a, g in zip(layers, acts, grads, strict=True):
            total = total + _layer(ggn, L, L.acts(a), jax.vmap(L.grads)(g), inverse_eigenvalues)
        for i, g in zip(others, other_grads, strict=True):
            total = total + jnp.sum(g.reshape(g.shape[0], -1) ** 2 * inverse_eigenvalues(i)[None], axis=1)
        return total

    return batched_map(jax.vmap(example), inputs, max(1, min(inputs.shape[0], batch)))


def _layer(ggn, L, a, g, inverse_eigenvalues):
    """A layer's (weight's and bias's) contribution for every output: ``a`` ``(R, G in)``, ``g`` ``(O, R, G out)``."""
    num_outputs = g.shape[0]
    G, n_in, n_out = L.groups, L.num_in, L.num_out
    total = jnp.zeros(num_outputs, g.dtype)
    if L.bias is not None:
        g_hat = g.sum(1)  # (O, G out)
        (Q,) = ggn.eigenvectors[L.bias]
        total = total + jnp.sum((g_hat @ Q) ** 2 * inverse_eigenvalues(L.bias)[None], axis=1)
    vectors, D = ggn.eigenvectors[L.weight], inverse_eigenvalues(L.weight)
    a = a.reshape(a.shape[0], G, n_in)
    g = g.reshape(num_outputs, g.shape[1], G, n_out)
    if L.in_perm is not None:
        a = a[:, :, np.asarray(L.in_perm)]  # into the kernel's row-major order of the input index
    if G == 1:
        vectors = tuple(V[None] for V in vectors)
    Q_out, Q_in = vectors if L.out_first else vectors[::-1]  # (G, out, out), (G, in, in)
    D = D.reshape(G, *((n_out, n_in) if L.out_first else (n_in, n_out)))
    if not L.out_first:
        D = jnp.swapaxes(D, 1, 2)  # (G, out, in)
    u = jnp.einsum("orgk,gkl->orgl", g, Q_out)  # gradients in the output eigenbasis
    v = jnp.einsum("rgi,gij->rgj", a, Q_in)  # activations in the input eigenbasis
    if a.shape[0] == 1:  # one position: T_o is an outer product
        return total + jnp.einsum("ogl,glj,gj->o", u[:, 0] ** 2, D, v[0] ** 2)
    T = jnp.einsum("orgl,rgj->oglj", u, v)
    return total + jnp.einsum("oglj,glj->o", T**2, D)
