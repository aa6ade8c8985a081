r"""A decoder-only byte-level transformer, its LoRA adapters, and the text it reads (every machine has it).

- `gpt`: pre-norm GPT blocks (causal multi-head attention, a GELU MLP), learned positions, a vocabulary of the
  256 byte values; ``fn(params, x)`` maps one sequence of ``T`` bytes to its ``(T, 256)`` next-byte logits.
  ``size="small"`` for tests (12,016 parameters), ``size="real"`` for the benchmarks and the command line
  (12.9M parameters).
- `add_lora`: low-rank adapters $W + \tfrac{\alpha}{r} A B$ on the attention projections (and optionally the MLP),
  the adapters under each layer's ``"lora_a"`` and ``"lora_b"`` (`lora_weights` selects them for
  ``posteriors.laplace(..., subset_of_weights=...)``);
- `corpus` and `windows`: the Python standard library's own files, read from this interpreter's installation
  (a fixed, listed selection: reproducible on one Python version): its source code split by package
  (``"train"``, ``"test"``), the documentation prose of ``pydoc_data`` for fine-tuning (``"docs"``), and the
  marshalled byte code of the test packages as clearly different bytes (``"bytecode"``, out of distribution).
  No download.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from posteriors.experiments.transformer import add_lora, gpt
    >>> from posteriors.experiments.architectures import count_params
    >>> fn, params = gpt(jax.random.key(0), size="small")
    >>> x = jnp.arange(8, dtype=jnp.int32)
    >>> fn(params, x).shape, count_params(params)
    ((8, 256), 12016)
    >>> fn_l, params_l = add_lora(fn, params, jax.random.key(1), rank=2)
    >>> bool(jnp.allclose(fn_l(params_l, x), fn(params, x)))        # B = 0: the base model's outputs
    True
"""

from __future__ import annotations

import marshal
import math
import sysconfig
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from linops.runtime import flat_draw

VOCAB = 256
ADAPTERS = ("lora_a", "lora_b")
"""The adapters' leaf names (`lora_weights` selects every leaf of these names)."""

_SIZES = {"small": dict(dim=16, depth=1, num_heads=2, context=16),
          "real": dict(dim=512, depth=4, num_heads=8, context=128)}


class _Config(NamedTuple):
    dim: int
    depth: int
    num_heads: int
    mlp_dim: int
    context: int
    lora_scale: float = 0.0


class GPT(eqx.Module):
    """The model function ``fn(params, x) -> (T, 256)`` of `gpt` (equal for equal configurations: their compiled
    programs are shared). ``x``: ``(T,)`` integer bytes, ``T`` at most the context."""

    config: _Config = eqx.field(static=True)

    def __call__(self, params, x):
        c = self.config
        T = x.shape[0]
        h = params["embed"][x] + params["positions"][:T]
        mask = jnp.tril(jnp.ones((T, T), bool))
        for block in params["blocks"]:
            a = _norm(block["norm1"], h)
            q, k, v = (self._dense(block[name], a) for name in ("query", "key", "value"))
            split = lambda t: t.reshape(T, c.num_heads, c.dim // c.num_heads)  # noqa: E731
            scores = jnp.einsum("thd,shd->hts", split(q), split(k)) / math.sqrt(c.dim // c.num_heads)
            weights = jax.nn.softmax(jnp.where(mask[None], scores, -jnp.inf), axis=-1)
            h = h + self._dense(block["out"], jnp.einsum("hts,shd->thd", weights, split(v)).reshape(T, c.dim))
            m = _norm(block["norm2"], h)
            h = h + self._dense(block["mlp_out"], jax.nn.gelu(self._dense(block["mlp_in"], m)))
        return self._dense(params["head"], _norm(params["norm"], h))

    def _dense(self, layer, a):
        out = a @ layer["kernel"] + layer["bias"][None]
        if "lora_a" in layer:
            out = out + self.config.lora_scale * ((a @ layer["lora_a"]) @ layer["lora_b"])
        return out


def _norm(p, h):
    mu = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mu) ** 2, axis=-1, keepdims=True)
    return (h - mu) * jax.lax.rsqrt(var + 1e-5) * p["scale"][None] + p["bias"][None]


def _dense_init(key, n_in, n_out, dtype):
    kernel = flat_draw(jax.random.normal, key, (n_in, n_out), dtype) / math.sqrt(n_in)
    return {"kernel": kernel, "bias": jnp.zeros(n_out, dtype)}


def _norm_init(dim, dtype):
    return {"scale": jnp.ones(dim, dtype), "bias": jnp.zeros(dim, dtype)}


def gpt(key, *, size: str = "real", dim: int | None = None, depth: int | None = None, num_heads: int | None = None,
        mlp_dim: int | None = None, context: int | None = None, dtype=jnp.float32):
    """A decoder-only byte-level transformer: ``(fn, params)``, ``fn(params, x)`` the ``(T, 256)`` next-byte
    logits of the ``(T,)`` bytes ``x`` (``T`` at most ``context``).

    Token embedding plus learned positions; ``depth`` pre-LayerNorm blocks of causal multi-head self-attention
    (query, key, value and output projections) and a GELU MLP of ``mlp_dim`` (default ``4 dim``), each in a
    residual connection; a final LayerNorm and an untied dense head. Every dense layer is a ``(in, out)`` kernel
    and a bias (`linops.kfac` finds them, shared over the positions). ``size="small"``: ``dim=16, depth=1,
    num_heads=2, context=16`` (12,016 parameters); ``size="real"``: ``dim=512, depth=4, num_heads=8,
    context=128`` (12,938,496 parameters).

    Examples:
        >>> import jax
        >>> from posteriors.experiments.architectures import count_params
        >>> from posteriors.experiments.transformer import gpt
        >>> count_params(jax.eval_shape(lambda k: gpt(k)[1], jax.random.key(0)))
        12938496
    """
    if size not in _SIZES:
        raise ValueError(f"gpt: size must be one of {tuple(_SIZES)}, got {size!r}")
    d = dict(_SIZES[size])
    d.update({k: v for k, v in dict(dim=dim, depth=depth, num_heads=num_heads, context=context).items()
              if v is not None})
    if d["dim"] % d["num_heads"]:
        raise ValueError(f"gpt: dim {d['dim']} is not a multiple of num_heads {d['num_heads']}")
    config = _Config(d["dim"], d["depth"], d["num_heads"], mlp_dim or 4 * d["dim"], d["context"])
    k_embed, k_pos, k_head, *k_blocks = jax.random.split(key, 3 + config.depth)
    D = config.dim
    blocks = []
    for kb in k_blocks:
        kq, kk, kv, ko, k1, k2 = jax.random.split(kb, 6)
        blocks.append({"norm1": _norm_init(D, dtype), "query": _dense_init(kq, D, D, dtype),
                       "key": _dense_init(kk, D, D, dtype), "value": _dense_init(kv, D, D, dtype),
                       "out": _dense_init(ko, D, D, dtype), "norm2": _norm_init(D, dtype),
                       "mlp_in": _dense_init(k1, D, config.mlp_dim, dtype),
                       "mlp_out": _dense_init(k2, config.mlp_dim, D, dtype)})
    params = {"embed": 0.02 * flat_draw(jax.random.normal, k_embed, (VOCAB, D), dtype),
              "positions": 0.02 * flat_draw(jax.random.normal, k_pos, (config.context, D), dtype),
              "blocks": blocks, "norm": _norm_init(D, dtype), "head": _dense_init(k_head, D, VOCAB, dtype)}
    return GPT(config), params


def add_lora(fn: GPT, params, key, *, rank: int = 8, alpha: float | None = None,
             targets=("query", "value"), mlp: bool = False):
    r"""``(fn, params)`` with LoRA adapters: each targeted layer's output gains $\tfrac{\alpha}{r}\,(a A) B$, ``A``
    ``(in, rank)`` Gaussian (scaled by $1/\sqrt{in}$), ``B`` ``(rank, out)`` zero, so the adapted model starts
    as the base one. ``targets``: the attention projections adapted (``"query"``, ``"key"``, ``"value"``,
    ``"out"``); ``mlp`` adapts both MLP layers too. ``alpha`` defaults to ``rank`` (a scale of one).

    Examples:
        >>> import jax
        >>> from posteriors.experiments.transformer import add_lora, gpt, lora_weights
        >>> fn, params = add_lora(*gpt(jax.random.key(0), size="small"), jax.random.key(1), rank=2)
        >>> lora_weights(params).leaves                      # query's and value's A and B
        (14, 15, 18, 19)
    """
    if not isinstance(fn, GPT):
        raise TypeError(f"add_lora: fn must be gpt's model, got {type(fn).__name__}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"add_lora: rank must be a positive integer, got {rank!r}")
    names = tuple(targets) + (("mlp_in", "mlp_out") if mlp else ())
    unknown = set(targets) - {"query", "key", "value", "out"}
    if unknown or not names:
        raise ValueError(f"add_lora: targets must be among 'query', 'key', 'value', 'out', got {tuple(targets)}")
    blocks = []
    for i, block in enumerate(params["blocks"]):
        block = dict(block)
        for j, name in enumerate(names):
            layer = dict(block[name])
            n_in, n_out = layer["kernel"].shape
            dtype = layer["kernel"].dtype
            k = jax.random.fold_in(key, i * len(names) + j)
            layer["lora_a"] = flat_draw(jax.random.normal, k, (n_in, rank), dtype) / math.sqrt(n_in)
            layer["lora_b"] = jnp.zeros((rank, n_out), dtype)
            block[name] = layer
        blocks.append(block)
    scale = float(rank if alpha is None else alpha) / rank
    return GPT(fn.config._replace(lora_scale=scale)), {**params, "blocks": blocks}


def lora_weights(params):
    """The adapters as a weight selection (`posteriors.weights.leaves` of every ``"lora_a"`` and ``"lora_b"``
    leaf): ``posteriors.laplace(..., subset_of_weights=lora_weights(params))`` is Laplace-LoRA.

    Examples:
        >>> import jax
        >>> from posteriors.experiments.transformer import add_lora, gpt, lora_weights
        >>> fn, params = add_lora(*gpt(jax.random.key(0), size="small"), jax.random.key(1), rank=2, targets=("query",))
        >>> lora_weights(params).leaves
        (14, 15)
    """
    from posteriors.weights import leaves, path_string

    paths = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    chosen = [p for p in paths if p.rsplit(".", 1)[-1] in ADAPTERS]
    if not chosen:
        raise ValueError("lora_weights: the parameters hold no adapters (add_lora adds them)")
    return leaves(params, *chosen)


def adapters_only(params):
    """``(trainable, merge)``: the adapter leaves as their own pytree, and ``merge(trainable) -> params`` with the
    base frozen (for an optax fine-tune of the adapters alone).

    Examples:
        >>> import jax
        >>> from posteriors.experiments.transformer import adapters_only, add_lora, gpt
        >>> fn, params = add_lora(*gpt(jax.random.key(0), size="small"), jax.random.key(1), rank=2)
        >>> trainable, merge = adapters_only(params)
        >>> len(jax.tree_util.tree_leaves(trainable)), merge(trainable)["blocks"][0]["query"]["lora_b"].shape
        (4, (2, 16))
    """
    trainable = [{name: {k: v for k, v in layer.items() if k in ADAPTERS} for name, layer in block.items()
                  if isinstance(layer, dict) and "lora_a" in layer} for block in params["blocks"]]

    def merge(t):
        blocks = [{name: ({**layer, **t[i][name]} if name in t[i] else layer) for name, layer in block.items()}
                  for i, block in enumerate(params["blocks"])]
        return {**params, "blocks": blocks}

    return trainable, merge


# --------------------------------------------------------------------------------------------------------------
# Text every machine has

TRAIN_PACKAGES = ("email", "json", "http", "logging", "asyncio", "concurrent", "importlib", "urllib", "xml",
                  "html", "wsgiref", "dbm", "ctypes", "sqlite3", "zoneinfo")
TEST_PACKAGES = ("collections", "multiprocessing", "xmlrpc", "tomllib", "unittest", "venv")
"""The standard library's packages read as in-distribution source code: trained on, and held out."""


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _package_files(packages) -> list[Path]:
    root = _stdlib()
    files = []
    for package in packages:
        files += sorted(p for p in (root / package).rglob("*.py") if "test" not in p.relative_to(root).parts[1:-1])
    return files


def corpus(split: str) -> bytes:
    """The bytes of one split of the standard library, concatenated in a fixed order (`TRAIN_PACKAGES`,
    `TEST_PACKAGES`): ``"train"`` and ``"test"`` source code (their packages' ``.py`` files, tests excluded),
    ``"docs"`` the documentation prose of ``pydoc_data/topics.py`` (fine-tuning text), ``"bytecode"`` the
    `marshal` bytes of the test packages' compiled code (out-of-distribution input).

    Examples:
        >>> from posteriors.experiments.transformer import corpus
        >>> len(corpus("train")) > 1_000_000, corpus("bytecode")[:1] != corpus("test")[:1]
        (True, True)
    """
    if split == "train":
        files = _package_files(TRAIN_PACKAGES)
    elif split == "test":
        files = _package_files(TEST_PACKAGES)
    elif split == "docs":
        files = [_stdlib() / "pydoc_data" / "topics.py"]
    elif split == "bytecode":
        return b"".join(marshal.dumps(compile(p.read_bytes(), str(p.name), "exec"))
                        for p in _package_files(TEST_PACKAGES))
    else:
        raise ValueError(f"corpus: split must be 'train', 'test', 'docs' or 'bytecode', got {split!r}")
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise FileNotFoundError(f"corpus({split!r}): this Python installation lacks {missing or 'the files'}")
    return b"".join(p.read_bytes() for p in files)


def windows(text: bytes, num: int, length: int, key) -> tuple[jax.Array, jax.Array]:
    """``num`` windows of ``length + 1`` bytes of ``text`` at random offsets (drawn with ``key``): inputs
    ``(num, length)`` and next-byte targets ``(num, length)``, both int32.

    Examples:
        >>> import jax
        >>> from posteriors.experiments.transformer import windows
        >>> x, y = windows(b"abcdefgh", 2, 3, jax.random.key(0))
        >>> bool((x[:, 1:] == y[:, :-1]).all()), x.shape
        (True, (2, 3))
    """
    data = np.frombuffer(text, np.uint8)
    if data.size < length + 1:
        raise ValueError(f"windows: {data.size} bytes cannot hold a window of {length + 1}")
    starts = np.asarray(jax.random.randint(key, (num,), 0, data.size - length))
    idx = starts[:, None] + np.arange(length + 1)[None, :]
    seq = data[idx].astype(np.int32)
    return jnp.asarray(seq[:, :-1]), jnp.asarray(seq[:, 1:])


__all__ = ["ADAPTERS", "GPT", "TEST_PACKAGES", "TRAIN_PACKAGES", "add_lora", "adapters_only", "corpus", "gpt",
           "lora_weights", "windows"]
