r"""Kronecker-factored curvature (KFAC) of the GGN for the dense and convolutional layers of any per-example model.

The layers are found in the model's traced program (`linops.nn.layers`): a product
$s_r = W a_r$ of a parameter leaf with an activation over $R$ shared positions (tokens, pixels;
$R = 1$ for a dense layer on a vector), a convolution being a dense layer on its input's
patches. One forward pass gives every $a_{n,r}$, and one vector-Jacobian product per row of the
likelihood's Hessian factor $A_n$ gives every $g_{n,r,k} = \partial (A_n f)_k / \partial s_{n,r}$.
The exact GGN block of $W$ (row-major, ``W`` of shape ``(out, in)``) is
$\sum_{n,k} \big(\sum_r g_{n,r,k} \otimes a_{n,r}\big)\big(\sum_r g_{n,r,k} \otimes a_{n,r}\big)^\top$,
approximated (Eschenhagen et al., NeurIPS 2023) as $B \otimes A$ with

- **expand** (the default; positions treated as examples):
  $A = \frac{1}{NR}\sum_{n,r} a_{n,r} a_{n,r}^\top$, $B = \sum_{n,r,k} g_{n,r,k} g_{n,r,k}^\top$,
  exact for a linear model with a Gaussian likelihood whose outputs each depend on one position;
- **reduce** (positions summed first): $A = \frac1N\sum_n \bar a_n \bar a_n^\top$ with
  $\bar a_n = \frac1R\sum_r a_{n,r}$, $B = \sum_{n,k} \hat g_{n,k}\hat g_{n,k}^\top$ with
  $\hat g_{n,k} = \sum_r g_{n,r,k}$, exact for a linear Gaussian model that pools its positions.

For $R = 1$ both are the classic KFAC, exact for a linear Gaussian model. The factors swap
(``A (x) B``) when the weight's row-major order has the output index last (``(in, out)``, Flax's
``HWIO`` kernels). A grouped convolution gets one pair of factors per group (its block is
block-diagonal over the groups). A bias's block $\sum_{n,k} \hat g_{n,k} \hat g_{n,k}^\top$ is
exact; weight and bias are separate blocks (their cross-covariance is dropped, as in
block-diagonal KFAC). Parameters in no recognised layer are listed in ``other_leaves``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.likelihoods import Likelihood
from linops.memory import check_fits
from linops.nn._operators import _check_batch_size, _check_likelihood, _check_model
from linops.nn.layers import kernel_leaves, tapped_vjp
from linops.nn.layers import trace_layers as _trace
from linops.runtime._batching import check_mesh, num_examples, sharded_sum
from linops.runtime._progress import check_label

APPROXIMATIONS = ("expand", "reduce")


class KFAC(eqx.Module):
    r"""Kronecker factors of the GGN per recognised layer, from `linops.kfac`.

    Attributes:
        factors: per layer, ``(first, second)`` with $G_W \approx$ ``first`` $\otimes$ ``second`` in the
            weight's row-major order; for a convolution with $G > 1$ feature groups each has a leading
            axis of length $G$, the block being block-diagonal over the groups.
        bias_blocks: per layer, the exact bias block (None without a bias).
        weight_leaves, bias_leaves: the layers' leaf indices in ``jax.tree_util.tree_leaves(params)``.
        other_leaves: leaf indices in no recognised layer (KFAC has no block for them).
        other_diagonals: with ``other_diagonal=True``, per leaf of ``other_leaves`` its exact GGN diagonal
            (shaped as the leaf), from the same pass over the data; else ``()``.
        leaf_sizes: the number of parameters of every leaf, in order.
        kinds: per layer, ``"dense"`` or ``"conv"``.
        positions: per layer, the number $R$ of positions its weight is shared over.
        approximation: ``"expand"`` or ``"reduce"``.
        num_examples: $N$.
        sums: with ``per_example``, its sum over the examples (from the same forward passes); else None.
    """

    factors: tuple
    bias_blocks: tuple
    weight_leaves: tuple = eqx.field(static=True)
    bias_leaves: tuple = eqx.field(static=True)
    other_leaves: tuple = eqx.field(static=True)
    leaf_sizes: tuple = eqx.field(static=True)
    num_examples: int = eqx.field(static=True)
    kinds: tuple = eqx.field(static=True, default=())
    positions: tuple = eqx.field(static=True, default=())
    approximation: str = eqx.field(static=True, default="expand")
    other_diagonals: tuple = ()
    sums: Any = None


class FoundLayer(NamedTuple):
    """A layer `find_layers` recognised: its ``kind`` (``"dense"`` or ``"conv"``), the leaf indices of its
    ``weight`` and ``bias`` (None without one) in ``jax.tree_util.tree_leaves(params)``, and the number of
    ``positions`` its weight is shared over."""

    kind: str
    weight: int
    bias: int | None
    positions: int


def find_layers(fn: Callable, params, x) -> tuple[FoundLayer, ...]:
    """The dense and convolutional layers of ``fn`` that `kfac` recognises, in the order the program runs them.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        params: the params pytree.
        x: one example (no leading example axis).

    Examples:
        >>> import jax, equinox as eqx, linops as lo
        >>> fn, params = lo.models.from_equinox(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0)))
        >>> tuple((L.kind, L.weight, L.bias) for L in lo.nn.find_layers(fn, params, jax.numpy.ones(3)))
        (('dense', 0, 1), ('dense', 2, 3))
    """
    layers, _, _ = _trace(fn, params, x)
    return tuple(FoundLayer(L.kind, L.weight, L.bias, L.positions) for L in layers)


def _warn_unrecognised(others, fn, params, x, other_diagonal, who):
    """Warn when kernels of the model's products (whole layers) are in no recognised layer, naming them."""
    missed = sorted(set(others) & kernel_leaves(fn, params, x)) if others else []
    if not missed:
        return
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves = jax.tree_util.tree_leaves(params)
    named = ", ".join(f"{paths[i] or '(the parameter array)'} {tuple(np.shape(leaves[i]))}" for i in missed)
    what = "get their exact GGN diagonal instead" if other_diagonal else "get no block (KFAC.other_leaves)"
    warnings.warn(f"{who}: {len(missed)} kernel(s) of the model's products are in no layer KFAC recognises and "
                  f"{what} of Kronecker factors: {named}. Recognised: a kernel used once, contracted over its "
                  "leading or trailing axes, or a convolution's kernel (linops.nn.find_layers lists the layers "
                  "found)", stacklevel=3)


def _default_batch_size(layers, rows, n, other_numbers=0):
    """Examples per batch so that a batch's activations and output gradients (and the gradients of
    ``other_numbers`` parameters in no layer) stay near $2^{24}$ numbers."""
    per_example = sum(L.positions * L.groups * (L.num_in + rows * L.num_out) for L in layers) + rows * other_numbers
    return int(max(1, min(n, (1 << 24) // max(per_example, 1))))


def _check_factors_fit(layers, params, who):
    """Refuse, before any pass over the data, factors that cannot fit: the sums over the batches and one
    batch's terms are alive together (a dense layer on 60,000 inputs has a 60,000 x 60,000 input factor)."""
    dtype = jnp.result_type(*[a.dtype for a in jax.tree_util.tree_leaves(params)])
    numbers = sum(L.groups * (L.num_in**2 + L.num_out**2) + (L.num_out**2 if L.bias is not None else 0)
                  for L in layers)
    widest = max(layers, key=lambda L: L.num_in)
    check_fits(2 * numbers * np.dtype(dtype).itemsize,
               f"{who}: the Kronecker factors of {len(layers)} layers (the widest with {widest.num_in} inputs)",
               "leave the widest layers out of KFAC (a diagonal or last-layer posterior), or reduce their width")


def kfac(fn: Callable, params, inputs, targets, likelihood: Likelihood, *, approximation: str = "expand",
         batch_size: int | None = None, mesh=None, axis: str = "data", other_diagonal: bool = False,
         progress: str | None = None, per_example: Callable | None = None) -> KFAC:
    r"""KFAC factors of the GGN of ``fn`` at ``params`` over the data: one pass over the batches.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; its dense and convolutional layers are found
            in its traced program (see the module docs).
        params: the params pytree.
        inputs: inputs with a leading example axis ``N`` (one array).
        targets: targets with a leading example axis.
        likelihood: a `linops.likelihoods.Likelihood` (its Hessian factor gives the rows).
        approximation: ``"expand"`` (default) or ``"reduce"``: how a weight shared over positions
            (tokens, pixels) is factored (module docs); the same for a layer with one position.
        batch_size: examples per batch (default: as many as keep a batch's activations and output
            gradients near $2^{24}$ numbers; the short last batch counts).
        mesh: a `jax.sharding.Mesh` to split the examples over: each device sums the factors of its
            share and the partial sums are ``psum``-reduced (as for `GGNOp`); None: one device.
        axis: the mesh axis the examples are split along (default ``"data"``).
        other_diagonal: also the exact GGN diagonal of the leaves in no recognised layer (norm scales,
            embeddings), from the same reverse passes (``KFAC.other_diagonals``).
        progress: a label: a progress bar over the batches under that label (once the pass runs longer
            than two seconds); None (default): no bar.
        per_example: ``per_example(f_n, y_n, lik_n) -> pytree`` of one example's outputs ``f_n``, target and
            likelihood (``lik_n`` None unless the likelihood is per example): summed over the examples from the
            same forward passes (``KFAC.sums``), e.g. the loss an evidence needs, without a pass of its own.

    Examples:
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
        >>> lo.kfac(fn, p, X, Y, lo.likelihoods.Gaussian(1.0), per_example=lambda f, y, _: jnp.sum((y - f) ** 2)).sums
        Array(0., dtype=float32)
    """
    who = "kfac"
    if approximation not in APPROXIMATIONS:
        raise ValueError(f"{who}: approximation must be one of {APPROXIMATIONS}, got {approximation!r}")
    _check_batch_size(batch_size, who)
    check_label(progress, who)
    if per_example is not None and not callable(per_example):
        raise TypeError(f"{who}: per_example must be a function (f_n, y_n, lik_n) -> pytree, or None; got "
                        f"{type(per_example).__name__}")
    mesh, axis = check_mesh(mesh, axis, who)
    n, _ = _check_model(fn, params, inputs, who)
    _check_likelihood(likelihood, who)
    if num_examples(targets) != n:
        raise ValueError(f"{who}: inputs has {n} examples but targets has {num_examples(targets)}")
    num_outputs = jax.eval_shape(fn, params, jax.tree_util.tree_map(lambda a: a[0], inputs)).shape[0]
    likelihood.check(num_outputs, targets, n, who)
    layers, tapped, leaves = _trace(fn, params, jax.tree_util.tree_map(lambda a: a[0], inputs))
    if not layers:
        raise ValueError(f"{who}: found no dense layer (a product of a parameter kernel with an activation) and no "
                         "convolution with a parameter kernel in fn's program; KFAC needs at least one")
    _check_factors_fit(layers, params, who)
    used = {L.weight for L in layers} | {L.bias for L in layers if L.bias is not None}
    others = tuple(i for i in range(len(leaves)) if i not in used)
    _warn_unrecognised(others, fn, params, jax.tree_util.tree_map(lambda a: a[0], inputs), other_diagonal, who)
    tapped_others = others if other_diagonal else ()
    if batch_size is None:  # the likelihood's Hessian factor has its factor_rows (O for the likelihoods)
        batch_size = _default_batch_size(layers, likelihood.factor_rows(num_outputs), n,
                                         sum(int(np.size(leaves[i])) for i in tapped_others))
    lik = likelihood if likelihood.per_example else None

    def example(x, y, lik_n):
        f_n, vjp, acts = tapped_vjp(layers, tapped, leaves, tapped_others, x)
        A_n = (lik_n if lik_n is not None else likelihood).hessian_factor(f_n, y)  # (K, O)
        grads, other_grads = jax.vmap(vjp)(A_n)  # per layer (K, *output shape); per other leaf (K, *shape)
        return ([L.acts(a) for L, a in zip(layers, acts, strict=True)],
                [jax.vmap(L.grads)(g) for L, g in zip(layers, grads, strict=True)],
                [jnp.sum(g**2, axis=0) for g in other_grads],
                None if per_example is None else per_example(f_n, y, lik_n))

    def batch(data):
        xb, yb, lb = data
        acts, grads, other_squares, extra = jax.vmap(example, in_axes=(0, 0, 0 if lb is not None else None))(
            xb, yb, lb)
        As, Bs, biases = [], [], []
        for L, a, g in zip(layers, acts, grads, strict=True):  # a: (b, G, in, R), g: (b, K, G, out, R)
            g_hat = g.sum(-1)  # (b, K, G, out): summed over the positions
            if L.bias is not None:
                flat = g_hat.reshape(-1, L.groups * L.num_out)
                biases.append(flat.T @ flat)
            else:
                biases.append(None)
            if approximation == "expand":
                As.append(jnp.einsum("bgir,bgjr->gij", a, a))
                if L.positions == 1:
                    Bs.append(jnp.einsum("bkgo,bkgp->gop", g[..., 0], g[..., 0]))
                else:  # per example and row a product over the positions (the minor axis of both operands, where
                    # one product over rows and positions together would transpose the K-times larger gradients)
                    Bs.append(jnp.sum(jnp.einsum("bkgor,bkgpr->bkgop", g, g), axis=(0, 1)))
            else:
                a = a.mean(-1)  # (b, G, in)
                As.append(jnp.einsum("bgi,bgj->gij", a, a))
                Bs.append(jnp.einsum("bkgo,bkgp->gop", g_hat, g_hat))
        return (As, Bs, biases, [jnp.sum(d, axis=0) for d in other_squares],
                jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), extra))

    As, Bs, biases, other_diagonals, sums = sharded_sum(batch, (inputs, targets, lik), batch_size, mesh, axis,
                                                        progress)
    factors = []
    for L, A, B in zip(layers, As, Bs, strict=True):
        A = A / (n * L.positions if approximation == "expand" else n)
        if L.in_perm is not None:
            A = A[:, L.in_perm][:, :, L.in_perm]
        if L.groups == 1:
            A, B = A[0], B[0]
        factors.append((B, A) if L.out_first else (A, B))
    return KFAC(tuple(factors), tuple(biases), tuple(L.weight for L in layers), tuple(L.bias for L in layers),
                others, tuple(int(np.size(leaf)) for leaf in leaves), n, tuple(L.kind for L in layers),
                tuple(L.positions for L in layers), approximation, tuple(other_diagonals), sums)


__all__ = ["KFAC", "FoundLayer", "find_layers", "kfac"]
