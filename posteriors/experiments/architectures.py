"""The network architectures the experiments, benchmarks and tests use (the library itself is model-agnostic).

Every builder returns ``(fn, params)`` in the library's model contract (`linops.models`): a per-example
``fn(params, x) -> (num_classes,)`` on one channels-first image ``x`` of shape ``(C, H, W)``, and a pytree of
float arrays. ``size="small"`` gives a network of a few hundred to a few thousand parameters on 8x8 or 12x12
images, for tests; ``size="real"`` gives $10^5$ to $10^6$ parameters on 28x28 MNIST-sized images. Keyword
arguments override the size's defaults; ``dtype`` casts the parameters (build inside
``with jax.enable_x64(True):`` for float64).

- `lenet5`: LeNet-5 (two 5x5 convolutions with max-pooling, three dense layers);
- `resnet`: a small ResNet with group, layer or (inference-mode) batch normalisation;
- `vit`: a small vision transformer;
- `nnx_cnn`: a small Flax NNX convolutional network (needs ``flax``).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from posteriors.experiments.architectures import ARCHITECTURES, count_params
    >>> build = ARCHITECTURES["resnet"]
    >>> fn, params = build(jax.random.key(0), size="small")
    >>> fn(params, jnp.ones((1, 8, 8))).shape, count_params(params)
    ((10,), 1374)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from linops.models import from_equinox, from_flax_nnx
from linops.runtime import flat_draw

_SIZES = ("small", "real")
_NORMS = ("group", "layer", "batch")


def count_params(params) -> int:
    """The number of scalar parameters in a params pytree (arrays or `jax.ShapeDtypeStruct` leaves).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.architectures import count_params, lenet5
        >>> count_params({"w": jnp.ones((3, 4)), "b": jnp.zeros(4)})
        16
        >>> count_params(jax.eval_shape(lambda k: lenet5(k, width=1.0)[1], jax.random.key(0)))  # classic LeNet-5
        61706
    """
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params) if hasattr(leaf, "shape"))


def _check_size(size: str, who: str) -> None:
    if size not in _SIZES:
        raise ValueError(f"{who}: size must be one of {_SIZES}, got {size!r}")


def _cast(tree, dtype):
    """``tree`` with its inexact arrays cast to ``dtype`` (``None``: unchanged)."""
    if dtype is None:
        return tree
    return jax.tree_util.tree_map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree)


# --------------------------------------------------------------------------------------------------------------
# LeNet-5


class _LeNet5(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    dense1: eqx.nn.Linear
    dense2: eqx.nn.Linear
    dense3: eqx.nn.Linear
    activation: Callable = eqx.field(static=True)

    def __call__(self, x):
        x = self.pool(self.activation(self.conv1(x)))
        x = self.pool(self.activation(self.conv2(x)))
        x = self.activation(self.dense1(x.reshape(-1)))
        x = self.activation(self.dense2(x))
        return self.dense3(x)


def lenet5(key, *, size: str = "real", in_channels: int = 1, image_size: int | None = None, num_classes: int = 10,
           width: float | None = None, activation: Callable = jax.nn.relu, dtype=None) -> tuple[Callable, Any]:
    """LeNet-5: conv 5x5 (same padding), ReLU, max-pool 2, conv 5x5 (valid), ReLU, max-pool 2, three dense layers.

    ``width`` scales the classic channels and units (6, 16; 120, 84): ``width=1`` is LeNet-5 itself
    (61,706 parameters on 28x28x1). ``size="real"`` uses ``width=2`` on 28x28 images (244,362 parameters),
    ``size="small"`` uses ``width=0.25`` on 12x12 images (1,277 parameters). Images must be at least 12x12.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.architectures import count_params, lenet5
        >>> fn, params = lenet5(jax.random.key(0), size="small")
        >>> fn(params, jnp.ones((1, 12, 12))).shape, count_params(params)
        ((10,), 1277)
    """
    _check_size(size, "lenet5")
    image_size = image_size if image_size is not None else {"small": 12, "real": 28}[size]
    width = width if width is not None else {"small": 0.25, "real": 2.0}[size]
    if image_size < 12:
        raise ValueError(f"lenet5: image_size must be at least 12 (two 2x2 poolings around a 5x5 valid conv), got "
                         f"{image_size}")
    c1, c2, u1, u2 = (max(1, round(n * width)) for n in (6, 16, 120, 84))
    side = ((image_size // 2) - 4) // 2
    k = jax.random.split(key, 5)
    model = _LeNet5(
        conv1=eqx.nn.Conv2d(in_channels, c1, 5, padding=2, key=k[0]),
        conv2=eqx.nn.Conv2d(c1, c2, 5, key=k[1]),
        pool=eqx.nn.MaxPool2d(2, 2),
        dense1=eqx.nn.Linear(c2 * side * side, u1, key=k[2]),
        dense2=eqx.nn.Linear(u1, u2, key=k[3]),
        dense3=eqx.nn.Linear(u2, num_classes, key=k[4]),
        activation=activation,
    )
    return from_equinox(_cast(model, dtype))


# --------------------------------------------------------------------------------------------------------------
# ResNet


def _norm_layer(norm: str, channels: int, side: int):
    if norm == "group":
        return eqx.nn.GroupNorm(math.gcd(channels, 8), channels)
    if norm == "layer":
        return eqx.nn.LayerNorm((channels, side, side))
    return eqx.nn.BatchNorm(channels, axis_name="batch", inference=True, mode="batch")


def _normalise(layer, x, state):
    if isinstance(layer, eqx.nn.BatchNorm):
        return layer(x, state)[0]  # inference mode: the state is read, never updated
    return layer(x)


class _Block(eqx.Module):
    conv1: eqx.nn.Conv2d
    norm1: Any
    conv2: eqx.nn.Conv2d
    norm2: Any
    project: eqx.nn.Conv2d | None

    def __init__(self, c_in: int, c_out: int, stride: int, side_out: int, norm: str, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, use_bias=False, key=k1)
        self.norm1 = _norm_layer(norm, c_out, side_out)
        self.conv2 = eqx.nn.Conv2d(c_out, c_out, 3, padding=1, use_bias=False, key=k2)
        self.norm2 = _norm_layer(norm, c_out, side_out)
        identity = stride == 1 and c_in == c_out
        self.project = None if identity else eqx.nn.Conv2d(c_in, c_out, 1, stride=stride, key=k3)

    def __call__(self, x, state):
        y = jax.nn.relu(_normalise(self.norm1, self.conv1(x), state))
        y = _normalise(self.norm2, self.conv2(y), state)
        return jax.nn.relu(y + (x if self.project is None else self.project(x)))


class _ResNet(eqx.Module):
    stem: eqx.nn.Conv2d
    stem_norm: Any
    blocks: list
    head: eqx.nn.Linear

    def __init__(self, in_channels, image_size, num_classes, widths, norm, key):
        k_stem, k_head, *k_blocks = jax.random.split(key, 2 + len(widths))
        self.stem = eqx.nn.Conv2d(in_channels, widths[0], 3, padding=1, use_bias=False, key=k_stem)
        self.stem_norm = _norm_layer(norm, widths[0], image_size)
        blocks, side, c_in = [], image_size, widths[0]
        for i, (c_out, k) in enumerate(zip(widths, k_blocks, strict=True)):
            stride = 1 if i == 0 else 2
            side = (side - 1) // stride + 1
            blocks.append(_Block(c_in, c_out, stride, side, norm, k))
            c_in = c_out
        self.blocks = blocks
        self.head = eqx.nn.Linear(widths[-1], num_classes, key=k_head)

    def __call__(self, x, state=None):
        x = jax.nn.relu(_normalise(self.stem_norm, self.stem(x), state))
        for block in self.blocks:
            x = block(x, state)
        return self.head(jnp.mean(x, axis=(1, 2)))


def _random_batch_stats(model, state, key):
    """``state`` with every BatchNorm's running mean drawn from N(0, 0.25^2) and variance from U(0.5, 2).

    Equinox's ``mode="batch"`` divides the stored statistics by ``1 - momentum**counter`` (zero-debiasing)
    unless the counter is 0; it is left at 0, so inference uses these values as they are.
    """
    layers = [m for m in jax.tree_util.tree_leaves(model, is_leaf=lambda m: isinstance(m, eqx.nn.BatchNorm))
              if isinstance(m, eqx.nn.BatchNorm)]
    for layer, k in zip(layers, jax.random.split(key, max(len(layers), 1)), strict=False):
        k_mean, k_var = jax.random.split(k)
        mean = 0.25 * jax.random.normal(k_mean, (layer.input_size,))
        var = jax.random.uniform(k_var, (layer.input_size,), minval=0.5, maxval=2.0)
        state = state.set(layer.batch_state_index, (mean, var))
    return state


def _build_resnet(key, *, size, in_channels, image_size, num_classes, widths, norm, dtype):
    """``(model, state)``: the module `resnet` wraps (``state`` holds BatchNorm's running statistics)."""
    _check_size(size, "resnet")
    if norm not in _NORMS:
        raise ValueError(f"resnet: norm must be one of {_NORMS}, got {norm!r}")
    image_size = image_size if image_size is not None else {"small": 8, "real": 28}[size]
    widths = tuple(widths) if widths is not None else {"small": (4, 8), "real": (32, 64, 128)}[size]
    if not widths:
        raise ValueError("resnet: widths must name at least one stage's channels, got ()")
    k_model, k_stats = jax.random.split(key)
    model, state = eqx.nn.make_with_state(_ResNet)(in_channels, image_size, num_classes, widths, norm, k_model)
    if norm == "batch":
        state = _random_batch_stats(model, state, k_stats)
    return _cast(model, dtype), _cast(state, dtype)


def resnet(key, *, size: str = "real", norm: str = "group", in_channels: int = 1, image_size: int | None = None,
           num_classes: int = 10, widths=None, dtype=None) -> tuple[Callable, Any]:
    """A small ResNet: a 3x3 stem conv, one residual block per stage, global average pooling, a dense head.

    Each block is two 3x3 convs, each followed by a normalisation layer, with ReLUs and a skip: the first
    stage's block keeps the shape (identity skip); every later stage's block halves the image with stride 2
    and projects the skip by a strided 1x1 conv. ``widths`` are the stages' channels: ``(32, 64, 128)`` for
    ``size="real"`` on 28x28 (307,882 parameters with group or batch norm; 532,714 with layer norm, whose
    affine maps are per element), ``(4, 8)`` for ``size="small"`` on 8x8 (1,374 with group or batch norm;
    3,366 with layer norm).

    ``norm`` is ``"group"`` (`eqx.nn.GroupNorm`, ``gcd(channels, 8)`` groups), ``"layer"`` (`eqx.nn.LayerNorm`
    over ``(C, H, W)``) or ``"batch"`` (`eqx.nn.BatchNorm` in inference mode: it normalises by running
    statistics held in an `eqx.nn.State` that ``fn`` closes over as a constant, never a parameter). So that the
    statistics matter, they are not the initial zeros/ones: running means are drawn from $N(0, 0.25^2)$ and
    variances from $U(0.5, 2)$, from ``key``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.architectures import count_params, resnet
        >>> fn, params = resnet(jax.random.key(0), size="small", norm="batch")
        >>> fn(params, jnp.ones((1, 8, 8))).shape, count_params(params)
        ((10,), 1374)
    """
    model, state = _build_resnet(key, size=size, in_channels=in_channels, image_size=image_size,
                                 num_classes=num_classes, widths=widths, norm=norm, dtype=dtype)
    if norm != "batch":
        return from_equinox(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def fn(p, x):
        return eqx.combine(p, static)(x, state)

    return fn, params


# --------------------------------------------------------------------------------------------------------------
# Vision transformer


class _TransformerBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(dim)
        self.attention = eqx.nn.MultiheadAttention(num_heads, dim, use_query_bias=True, use_key_bias=True,
                                                   use_value_bias=True, use_output_bias=True, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim)
        self.mlp_in = eqx.nn.Linear(dim, mlp_dim, key=k2)
        self.mlp_out = eqx.nn.Linear(mlp_dim, dim, key=k3)

    def __call__(self, tokens):
        h = jax.vmap(self.norm1)(tokens)
        tokens = tokens + self.attention(h, h, h)
        h = jax.vmap(self.norm2)(tokens)
        return tokens + jax.vmap(lambda t: self.mlp_out(jax.nn.gelu(self.mlp_in(t))))(h)


class _ViT(eqx.Module):
    embed: eqx.nn.Conv2d
    cls_token: jax.Array | None
    positions: jax.Array
    blocks: list
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, in_channels, image_size, patch_size, num_classes, dim, depth, num_heads, mlp_dim, pool, key):
        k_embed, k_cls, k_pos, k_head, *k_blocks = jax.random.split(key, 4 + depth)
        num_tokens = (image_size // patch_size) ** 2 + (pool == "cls")
        self.embed = eqx.nn.Conv2d(in_channels, dim, patch_size, stride=patch_size, key=k_embed)
        self.cls_token = 0.02 * jax.random.normal(k_cls, (dim,)) if pool == "cls" else None
        self.positions = 0.02 * flat_draw(jax.random.normal, k_pos, (num_tokens, dim))
        self.blocks = [_TransformerBlock(dim, num_heads, mlp_dim, k) for k in k_blocks]
        self.norm = eqx.nn.LayerNorm(dim)
        self.head = eqx.nn.Linear(dim, num_classes, key=k_head)

    def __call__(self, x):
        patches = self.embed(x)  # (dim, H / patch, W / patch)
        tokens = patches.reshape(patches.shape[0], -1).T
        if self.cls_token is not None:
            tokens = jnp.concatenate([self.cls_token[None], tokens])
        tokens = tokens + self.positions
        for block in self.blocks:
            tokens = block(tokens)
        tokens = jax.vmap(self.norm)(tokens)
        return self.head(tokens[0] if self.cls_token is not None else jnp.mean(tokens, axis=0))


def vit(key, *, size: str = "real", patch_size: int = 4, in_channels: int = 1, image_size: int | None = None,
        num_classes: int = 10, dim: int | None = None, depth: int | None = None, num_heads: int | None = None,
        mlp_dim: int | None = None, pool: str = "cls", dtype=None) -> tuple[Callable, Any]:
    """A small vision transformer: patch embedding, learned positions, pre-LayerNorm blocks, a dense head.

    Patches of ``patch_size`` are embedded by a conv of that stride; a learned position table is added
    (with a class token in front when ``pool="cls"``, read out at the end; ``pool="mean"`` averages the
    tokens instead). Each of the ``depth`` blocks is multi-head self-attention (`eqx.nn.MultiheadAttention`)
    and a per-token GELU MLP, each after a LayerNorm and inside a residual connection; a final LayerNorm and
    a dense layer give the logits. ``size="real"``: 28x28 images, ``dim=64, depth=4, num_heads=4,
    mlp_dim=128`` (139,018 parameters with ``patch_size=4``); ``size="small"``: 8x8 images,
    ``dim=16, depth=1, num_heads=2, mlp_dim=32`` (2,794 parameters).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.architectures import count_params, vit
        >>> fn, params = vit(jax.random.key(0), size="small")
        >>> fn(params, jnp.ones((1, 8, 8))).shape, count_params(params)
        ((10,), 2794)
    """
    _check_size(size, "vit")
    small = size == "small"
    image_size = image_size if image_size is not None else (8 if small else 28)
    dim = dim if dim is not None else (16 if small else 64)
    depth = depth if depth is not None else (1 if small else 4)
    num_heads = num_heads if num_heads is not None else (2 if small else 4)
    mlp_dim = mlp_dim if mlp_dim is not None else 2 * dim
    if image_size % patch_size:
        raise ValueError(f"vit: image_size {image_size} is not a multiple of patch_size {patch_size}; choose a "
                         "patch size that divides it")
    if dim % num_heads:
        raise ValueError(f"vit: dim {dim} is not a multiple of num_heads {num_heads}")
    if pool not in ("cls", "mean"):
        raise ValueError(f"vit: pool must be 'cls' or 'mean', got {pool!r}")
    model = _ViT(in_channels, image_size, patch_size, num_classes, dim, depth, num_heads, mlp_dim, pool, key)
    return from_equinox(_cast(model, dtype))


# --------------------------------------------------------------------------------------------------------------
# Flax NNX CNN


@functools.cache
def _nnx_cnn_class():
    """The NNX module class, defined on first use so that importing this module does not need flax."""
    try:
        from flax import nnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nnx_cnn needs flax (pip install flax)") from e

    class NNXCNN(nnx.Module):
        """conv 3x3, ReLU, avg-pool 2, conv 3x3, ReLU, avg-pool 2, dense, ReLU, dense, on one (C, H, W) image."""

        def __init__(self, in_channels, image_size, num_classes, channels, hidden, rngs):
            side = image_size // 2 // 2
            self.conv1 = nnx.Conv(in_channels, channels[0], (3, 3), padding="SAME", rngs=rngs)
            self.conv2 = nnx.Conv(channels[0], channels[1], (3, 3), padding="SAME", rngs=rngs)
            self.dense1 = nnx.Linear(channels[1] * side * side, hidden, rngs=rngs)
            self.dense2 = nnx.Linear(hidden, num_classes, rngs=rngs)

        def __call__(self, x):
            # NNX convs are channels-last; they accept one unbatched (H, W, C) image as it is.
            x = jnp.transpose(x, (1, 2, 0))
            x = nnx.avg_pool(jax.nn.relu(self.conv1(x)), (2, 2), strides=(2, 2))
            x = nnx.avg_pool(jax.nn.relu(self.conv2(x)), (2, 2), strides=(2, 2))
            return self.dense2(jax.nn.relu(self.dense1(x.reshape(-1))))

    return NNXCNN, nnx


def nnx_cnn(key_or_seed, *, size: str = "small", in_channels: int = 1, image_size: int | None = None,
            num_classes: int = 10, channels=None, hidden: int | None = None, dtype=None) -> tuple[Callable, Any]:
    """A small Flax NNX CNN through `linops.models.from_flax_nnx` (needs ``flax``).

    conv 3x3 (same padding), ReLU, average-pool 2, conv 3x3, ReLU, average-pool 2, dense, ReLU, dense. Like
    the other builders, ``fn`` takes one channels-first image ``(C, H, W)`` and transposes it inside (NNX
    convs are channels-last). ``key_or_seed`` is a jax.random key or an int seed for `flax.nnx.Rngs`;
    ``params`` is an `nnx.State` of the `nnx.Param` variables. ``size="small"``: 8x8 images, channels
    ``(4, 8)``, 16 hidden units (1,034 parameters); ``size="real"``: 28x28 images, channels ``(32, 64)``,
    128 hidden units (421,642 parameters). ``dtype`` casts the parameters (the layers compute in the dtype
    their inputs and parameters promote to).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.experiments.architectures import count_params, nnx_cnn
        >>> fn, params = nnx_cnn(0, size="small")
        >>> fn(params, jnp.ones((1, 8, 8))).shape, count_params(params)
        ((10,), 1034)
    """
    _check_size(size, "nnx_cnn")
    cls, nnx = _nnx_cnn_class()
    image_size = image_size if image_size is not None else {"small": 8, "real": 28}[size]
    channels = tuple(channels) if channels is not None else {"small": (4, 8), "real": (32, 64)}[size]
    hidden = hidden if hidden is not None else {"small": 16, "real": 128}[size]
    if image_size < 4:
        raise ValueError(f"nnx_cnn: image_size must be at least 4 (two 2x2 poolings), got {image_size}")
    if len(channels) != 2:
        raise ValueError(f"nnx_cnn: channels must give the two convs' channels, got {channels}")
    module = cls(in_channels, image_size, num_classes, channels, hidden, nnx.Rngs(key_or_seed))
    fn, params = from_flax_nnx(module)
    return fn, _cast(params, dtype)


ARCHITECTURES: dict[str, Callable[..., tuple[Callable, Any]]] = {
    "lenet5": lenet5,
    "resnet": resnet,
    "vit": vit,
    "nnx_cnn": nnx_cnn,
}

__all__ = ["ARCHITECTURES", "count_params", "lenet5", "nnx_cnn", "resnet", "vit"]
