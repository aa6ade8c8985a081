"""`StreamingGGNOp`: the GGN over data that does not fit in memory, one batch at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import equinox as eqx
import jax
import numpy as np

from linops.algebra import _tags
from linops.algebra._base import LinearOperator
from linops.likelihoods import Likelihood
from linops.models import ravel
from linops.nn._operators import _check_likelihood, _check_model, ggn_batch_product
from linops.runtime import _progress
from linops.runtime._compile import program


class _Opaque:
    """Holds host data as static structure: compared by identity, never traced."""

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other


@program
def _batch_kernel(fn, params, tangent, xb, yb, likelihood):
    return ggn_batch_product(fn, params, tangent, xb, yb, likelihood, None)


class StreamingGGNOp(LinearOperator):
    r"""$G = \sum_n J_n^\top H_n J_n$ over batches read from a Python iterable.

    Each product loops over the batches in Python and runs one jitted per-batch kernel
    (compiled once per batch shape, so a short last batch compiles once more), keeping
    only one batch on the device. It equals `GGNOp` on the same data. Use it eagerly: under
    `jax.jit` the loop would be unrolled over every batch.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        params: the params pytree.
        batches: a sequence of ``(inputs, targets)`` pairs, or a function returning a fresh
            iterator of them (a generator is read once per product, so it must be restartable).
        likelihood: a likelihood without per-example parameters.
        progress: a progress bar over the batches of each product on stderr (`tqdm`; shown once a
            product runs longer than two seconds).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> fn = lambda w, x: (x @ w)[None]
        >>> batches = [(jnp.array([[1.0, 0.0], [1.0, 1.0]]), jnp.zeros((2, 1))),
        ...            (jnp.array([[1.0, 2.0]]), jnp.zeros((1, 1)))]
        >>> G = lo.StreamingGGNOp(fn, jnp.zeros(2), batches, lo.likelihoods.Gaussian(1.0))
        >>> G @ jnp.array([1.0, 0.0])
        Array([3., 3.], dtype=float32)
    """

    fn: Callable = eqx.field(static=True)
    params: object
    likelihood: Likelihood
    batches: _Opaque = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    unravel: Callable = eqx.field(static=True)
    num_examples: int = eqx.field(static=True)
    num_batches: int = eqx.field(static=True)
    num_params: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)

    def __init__(self, fn, params, batches: Iterable | Callable, likelihood: Likelihood, *, progress: bool = False):
        who = "StreamingGGNOp"
        _check_likelihood(likelihood, who)
        if likelihood.per_example:
            raise ValueError(f"{who}: a per-example likelihood (heteroscedastic sigma) needs GGNOp on in-memory data")
        if not (callable(batches) or hasattr(batches, "__iter__")):
            raise TypeError(
                f"{who}: batches must be a sequence of (inputs, targets) or a function returning an iterator"
            )
        if hasattr(batches, "__next__"):
            raise TypeError(f"{who}: batches is a one-shot iterator; pass a list or a function returning a fresh one")
        n, count, outputs = 0, 0, None
        for i, batch in enumerate(batches() if callable(batches) else batches):
            if not (isinstance(batch, tuple | list) and len(batch) == 2):
                raise ValueError(f"{who}: batch {i} must be an (inputs, targets) pair")
            xb, yb = batch
            nb, o = _check_model(fn, params, xb, f"{who} (batch {i})")
            if outputs is not None and o != outputs:
                raise ValueError(f"{who}: batch {i} gives {o} outputs, earlier batches {outputs}")
            nt = jax.tree_util.tree_leaves(yb)[0].shape[0]
            if nt != nb:
                raise ValueError(f"{who}: batch {i} has {nb} inputs but {nt} targets")
            likelihood.check(o, yb, nb, f"{who} (batch {i})")
            n, count, outputs = n + nb, count + 1, o
        if count == 0:
            raise ValueError(f"{who}: batches is empty")
        flat, unravel = ravel(params)
        self.fn, self.params, self.likelihood = fn, params, likelihood
        self.batches, self.progress, self.unravel = _Opaque(batches), bool(progress), unravel
        self.num_examples, self.num_batches, self.num_params = n, count, flat.shape[0]
        self.dtype_ = np.dtype(flat.dtype)

    @property
    def shape(self):
        return (self.num_params, self.num_params)

    @property
    def dtype(self):
        return self.dtype_

    @property
    def tags(self):
        return _tags.close({_tags.psd}, self.shape)

    def _iter(self):
        source = self.batches.value
        return source() if callable(source) else iter(source)

    def mv(self, v):
        t = self.unravel(v)
        total = None
        bar = _progress.new_bar("StreamingGGNOp product", self.num_batches, "batch") if self.progress else None
        for xb, yb in self._iter():
            part = _batch_kernel(self.fn, self.params, t, xb, yb, self.likelihood)
            total = part if total is None else total + part
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return total

    rmv = mv

    def transpose(self):
        return self
