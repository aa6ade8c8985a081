r"""Which weights a Laplace posterior covers: the first of `posteriors.laplace`'s two axes.

`posteriors.laplace` takes ``subset_of_weights=`` (which weights) and ``structure=`` (which curvature
structure, `posteriors.STRUCTURES`) independently, as laplace-torch does. The weights not covered stay
at $\theta^*$: the posterior is $\mathcal N(\theta^*, E_s \Sigma_s E_s^\top)$, $E_s$ the selection of
the covered weights and $\Sigma_s$ the posterior of the model restricted to them.

A selection is a small `Weights` class that owns every rule that depends on it: the model restricted
to its weights (the fit and the predictive run on it), its flat indices (the covariance's embedding,
the samples' scatter, the evidence's $\theta_s^*$), the prior's groups (one precision per leaf) and what
a saved file records (its static fields). The built-in selections:

- `AllWeights` (``"all"``, the default);
- `Leaves`: whole leaves, chosen by path prefix (`leaves`: an adapter's weights, a block) or the last
  dense layer of the model's program (``"last_layer"``, `last_layer_leaves`);
- `Indices`: any flat indices (a subnetwork: `posteriors.subnetwork`'s strategies return a
  `posteriors.Subnetwork`, which ``subset_of_weights=`` accepts as its `Indices`).

A new selection is a `Weights` subclass in this file (and, for a string name, an entry in `NAMES`).

Examples:
    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> import posteriors as pst
    >>> from linops.likelihoods import Gaussian
    >>> from linops.models import from_equinox
    >>> fn, params = from_equinox(eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0)))
    >>> X = jax.random.normal(jax.random.key(1), (8, 2)); Y = jnp.zeros((8, 1))
    >>> post = pst.laplace(fn, params, (X, Y), Gaussian(1.0), subset_of_weights="last_layer", structure="diag")
    >>> post.weights.leaves, post.weights.indices.shape, post.covariance.shape     # 4 weights + 1 bias
    ((2, 3), (5,), (17, 17))
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.models import check_indices, ravel, restrict


def path_string(path) -> str:
    """``"layers.0.weight"`` for a pytree key path.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from posteriors.weights import path_string
        >>> [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path({"head": [jnp.zeros(2)]})[0]]
        ['head.0']
    """
    return ".".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _leaf_sizes(params) -> list[int]:
    return [int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(params)]


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


class Weights(eqx.Module):
    """Abstract: a selection of the model's weights that a posterior covers (the rest stay at $\\theta^*$).

    A subclass gives `restrict`, `group_sizes` and the flat `indices` (None: every weight); `fit_form` when
    its fields hold arrays that a compiled fit should see as static data. See the module's docstring.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import indices
        >>> w = indices({"a": jnp.zeros(2), "b": jnp.ones(3)}, [1, 3])     # one weight of each leaf
        >>> fn_s, theta_s = w.restrict(lambda p, x: p["a"] * x + p["b"].sum(), {"a": jnp.zeros(2), "b": jnp.ones(3)})
        >>> theta_s, fn_s(jnp.array([5.0, 7.0]), jnp.ones(2))              # a[1] = 5, b[1] = 7
        (Array([0., 1.], dtype=float32), Array([ 9., 14.], dtype=float32))
        >>> w.embed(lo.Identity(2), 5, jnp.float32).as_matrix().diagonal()
        Array([0., 1., 0., 1., 0.], dtype=float32)
    """

    def describe(self) -> str:
        """How messages and progress bars name the selection (as ``subset_of_weights=`` would be written)."""
        return repr(type(self).__name__)

    restricts_by_index: ClassVar[bool] = False
    """Whether the restricted model scatters flat indices into whole leaves (its Jacobian rows then pass through
    those leaves: the predictive plans its memory with the model's parameter count)."""

    @property
    @abc.abstractmethod
    def indices(self) -> jax.Array | None:
        """The covered weights' sorted flat indices into the raveled parameters; None for all of them."""

    @abc.abstractmethod
    def restrict(self, fn: Callable, params) -> tuple[Callable, Any]:
        """``(fn_s, params_s)``: the model as a function of the covered weights alone (the others closed over,
        so derivatives never pass through them)."""

    @abc.abstractmethod
    def group_sizes(self, params) -> list[int]:
        """The sizes of the restricted model's leaves (``params_s``), in order: the groups of a per-leaf prior."""

    def fit_form(self) -> Weights:
        """The selection as a compiled fit should key it (the default: itself)."""
        return self

    def take(self, flat: jax.Array) -> jax.Array:
        """The covered entries of a flat vector ``(P,)`` (or of a per-parameter prior)."""
        return flat if self.indices is None else flat[self.indices]

    def embed(self, op: lo.LinearOperator, num_params: int, dtype) -> lo.LinearOperator:
        """$E_s \\, \\text{op} \\, E_s^\\top$: an operator on the covered weights as a ``P x P`` one."""
        if self.indices is None:
            return op
        E = lo.Selection(self.indices, num_params, dtype=dtype)
        return E.T @ op @ E

    def scatter(self, deltas: jax.Array, num_params: int) -> jax.Array:
        """``(P, n)`` from ``(S, n)`` offsets of the covered weights (zero elsewhere)."""
        if self.indices is None:
            return deltas
        return jnp.zeros((num_params, deltas.shape[1]), deltas.dtype).at[self.indices].set(deltas)


class AllWeights(Weights):
    """Every weight (``subset_of_weights="all"``).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import AllWeights
        >>> AllWeights().indices is None, AllWeights().group_sizes({"a": jnp.zeros(3), "b": jnp.zeros((2, 2))})
        (True, [3, 4])
    """

    def describe(self):
        return "'all'"

    @property
    def indices(self):
        return None

    def restrict(self, fn, params):
        return fn, params

    def group_sizes(self, params):
        return _leaf_sizes(params)


def _leaf_flat_indices(params, leaves) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(_leaf_sizes(params))])
    return np.concatenate([np.arange(starts[i], starts[i + 1]) for i in leaves])


class Leaves(Weights):
    """Whole leaves of the params pytree: a layer, a block, an adapter's matrices.

    Build it with `leaves` (by path prefix) or `last_layer`; ``indices`` are the leaves' flat indices.

    Attributes:
        leaves: the chosen leaves' positions in ``jax.tree_util.tree_leaves(params)`` (sorted).
        indices: their flat indices.
        name: how they were chosen (``"last_layer"``, or the path prefixes).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import leaves
        >>> w = leaves({"head": {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}, "body": jnp.zeros(4)}, "head")
        >>> w.leaves, w.indices.tolist(), w.name
        ((1, 2), [4, 5, 6, 7, 8, 9, 10, 11], 'head')
    """

    leaves: tuple = eqx.field(static=True)
    flat: jax.Array
    name: str = eqx.field(static=True)

    def describe(self):
        return repr(self.name)

    @property
    def indices(self):
        return self.flat

    def restrict(self, fn, params):
        all_leaves, treedef = jax.tree_util.tree_flatten(params)
        chosen = self.leaves

        def fn_s(params_s, x):
            full = list(all_leaves)
            for i, leaf in zip(chosen, params_s, strict=True):
                full[i] = leaf
            return fn(jax.tree_util.tree_unflatten(treedef, full), x)

        return fn_s, tuple(all_leaves[i] for i in chosen)

    def group_sizes(self, params):
        sizes = _leaf_sizes(params)
        return [sizes[i] for i in self.leaves]


def _make_leaves(params, chosen, name) -> Leaves:
    chosen = tuple(sorted(int(i) for i in chosen))
    return Leaves(chosen, jax.device_put(_leaf_flat_indices(params, chosen)), name)


def leaves(params, *prefixes: str) -> Leaves:
    """The leaves whose path (``"layers.2.weight"``, `path_string`) starts with one of ``prefixes`` (a whole
    path component: ``"layers.1"`` is not ``"layers.10"``), e.g. a LoRA adapter's ``"lora"`` matrices.

    Examples:
        >>> import jax, equinox as eqx
        >>> from linops.models import from_equinox
        >>> from posteriors.weights import leaves
        >>> fn, params = from_equinox(eqx.nn.MLP(2, 3, 8, 2, key=jax.random.key(0)))
        >>> leaves(params, "layers.0", "layers.2").leaves
        (0, 1, 4, 5)
        >>> leaves({"lora": {"a": jax.numpy.zeros(2)}, "w": jax.numpy.zeros(2)}, "lor")
        Traceback (most recent call last):
        ...
        ValueError: weights.leaves: no parameter path starts with 'lor'; paths: ['lora.a', 'w']
    """
    if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(f"weights.leaves: pass one or more path prefixes (non-empty strings), got {prefixes!r}")
    names = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    chosen = []
    for prefix in prefixes:
        hit = [i for i, name in enumerate(names) if name == prefix or name.startswith(prefix + ".")]
        if not hit:
            raise ValueError(f"weights.leaves: no parameter path starts with {prefix!r}; paths: {names}")
        chosen += hit
    return _make_leaves(params, set(chosen), ",".join(prefixes))


def last_layer_leaves(params, last_layer=None, *, fn=None, x=None) -> list[int]:
    """Leaf indices of the last layer: the weight and bias of the last dense layer in ``fn``'s traced program
    on one example ``x`` (`linops.nn.find_layers`: after any pooling or normalisation, for any model), or the
    leaves under the path prefix ``last_layer`` (``"layers.2"``). Without ``fn``: the leaves under the parent
    of the last 2-D leaf (an Equinox MLP's ``layers[-1]``; a Flax NNX layer's ``kernel`` and ``bias``).

    Examples:
        >>> import jax, equinox as eqx
        >>> from posteriors.weights import last_layer_leaves
        >>> from linops.models import from_equinox
        >>> fn, params = from_equinox(eqx.nn.MLP(2, 3, 8, 2, key=jax.random.key(0)))
        >>> last_layer_leaves(params), last_layer_leaves(params, "layers.1")
        ([4, 5], [2, 3])
        >>> last_layer_leaves(params, fn=fn, x=jax.numpy.ones(2))
        [4, 5]
    """
    with_paths = jax.tree_util.tree_flatten_with_path(params)[0]
    names = [path_string(p) for p, _ in with_paths]
    if last_layer is not None:
        chosen = [i for i, name in enumerate(names) if name == last_layer or name.startswith(last_layer + ".")]
        if not chosen:
            raise ValueError(f"last_layer: no parameter path starts with {last_layer!r}; paths: {names}")
        return chosen
    if fn is not None:
        layers = lo.nn.find_layers(fn, params, x)
        if layers and layers[-1].kind != "dense":  # a convolutional head: the last dense layer is not the output's
            raise ValueError(f"last_layer: the last layer with weights in fn's program is a {layers[-1].kind} layer "
                             f"({names[layers[-1].weight]}), not a dense one; a last-layer posterior needs a dense "
                             "output layer: name the leaves to use, last_layer='<path prefix>', or choose them with "
                             "pst.weights.leaves(params, '<path prefix>')")
        dense = [L for L in layers if L.kind == "dense"]
        if dense:
            return sorted(i for i in (dense[-1].weight, dense[-1].bias) if i is not None)
    matrices = [i for i, (_, leaf) in enumerate(with_paths) if jnp.ndim(leaf) == 2]
    if not matrices:
        raise ValueError("last_layer: found no dense layer in fn's program and params have no 2-D leaf (a weight "
                         f"matrix); name the layer: last_layer='<path prefix>', paths: {names}")
    path = with_paths[matrices[-1]][0]
    if getattr(path[-1], "name", None) == "value" or getattr(path[-1], "key", None) == "value":
        path = path[:-1]  # a Flax NNX variable's ``.value``: the layer is one level up
    prefix = path[:-1]
    return [i for i, (p, _) in enumerate(with_paths) if p[: len(prefix)] == prefix]


def last_layer(params, name: str | None = None, *, fn=None, x=None) -> Leaves:
    """The last layer's leaves as a `Leaves` selection (``subset_of_weights="last_layer"``): found in
    ``fn``'s program on the example ``x``, or named by the path prefix ``name`` (`last_layer_leaves`).

    Examples:
        >>> import jax, equinox as eqx
        >>> from linops.models import from_equinox
        >>> from posteriors.weights import last_layer
        >>> fn, params = from_equinox(eqx.nn.MLP(2, 3, 8, 2, key=jax.random.key(0)))
        >>> last_layer(params, fn=fn, x=jax.numpy.ones(2)).leaves
        (4, 5)
    """
    return _make_leaves(params, last_layer_leaves(params, name, fn=fn, x=x), "last_layer")


class _IndexSet:
    """Concrete flat indices as static data of a compiled program: equal when the indices are."""

    def __init__(self, indices):
        self.value = np.asarray(indices)
        self._key = (self.value.dtype.str, self.value.shape, self.value.tobytes())

    def __eq__(self, other):
        return isinstance(other, _IndexSet) and self._key == other._key

    def __hash__(self):
        return hash(self._key)


def _restrict_traced(fn, params, indices):
    """`linops.models.restrict` for traced ``indices`` (checked where they were made): the subset is scattered
    into the whole flat vector; the same values, with derivatives through every leaf."""
    flat, unravel = ravel(params)

    def fn_s(v, x):
        return fn(unravel(flat.at[indices].set(v.astype(flat.dtype))), x)

    return fn_s, flat[indices]


class Indices(Weights):
    """Any flat indices into the raveled parameters (a subnetwork): the restricted model's parameter is one
    flat vector of the chosen weights (`linops.models.restrict`).

    Attributes:
        flat: ``(S,)`` sorted flat indices.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import indices
        >>> w = indices(jnp.zeros(5), [4, 0])
        >>> w.indices.tolist(), w.group_sizes(jnp.zeros(5))
        ([0, 4], [2])
    """

    flat: jax.Array
    restricts_by_index: ClassVar[bool] = True

    @property
    def indices(self):
        return self.flat

    def describe(self):
        return f"{self.flat.shape[0]} indices"

    def restrict(self, fn, params):
        if _traced(self.flat):
            return _restrict_traced(fn, params, self.flat)
        return restrict(fn, params, np.asarray(self.flat))

    def group_sizes(self, params):
        return [int(self.flat.shape[0])]

    def fit_form(self):
        return self if _traced(self.flat) else _StaticIndices(_IndexSet(self.flat))


class _StaticIndices(Weights):
    """`Indices` with concrete indices as static data: a compiled fit keys them by value and restricts the model
    with leaf-local scatters (`linops.models.restrict`), not through the whole flat vector."""

    index_set: _IndexSet = eqx.field(static=True)
    restricts_by_index: ClassVar[bool] = True

    @property
    def indices(self):
        return self.index_set.value

    def restrict(self, fn, params):
        return restrict(fn, params, self.index_set.value)

    def group_sizes(self, params):
        return [int(self.index_set.value.shape[0])]


def indices(params, flat_indices) -> Indices:
    """An `Indices` selection from flat indices (checked: in range, no repeats; sorted).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import indices
        >>> indices(jnp.zeros(3), [3])
        Traceback (most recent call last):
        ...
        ValueError: weights.indices: indices must lie in [0, 3) for 3 parameters, got range [3, 3]
    """
    P = ravel(params)[0].shape[0]
    return Indices(jax.device_put(check_indices(flat_indices, P, "weights.indices").astype(np.int32)))


NAMES: dict[str, Callable] = {
    "all": lambda params, fn, x, last_layer_name: AllWeights(),
    "last_layer": lambda params, fn, x, last_layer_name: last_layer(params, last_layer_name, fn=fn, x=x),
}
"""``subset_of_weights=`` name -> ``(params, fn, example, last_layer) -> Weights``."""


def select(spec, params, *, fn=None, x=None, last_layer_name=None, who: str = "laplace") -> Weights:
    """The `Weights` a ``subset_of_weights=`` value names: a name of `NAMES`, a `Weights`, or an object with an
    ``as_weights()`` method (a `posteriors.Subnetwork`); checked against ``params``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.weights import select
        >>> select("all", jnp.zeros(3))
        AllWeights()
        >>> select("some", jnp.zeros(3), who="my_fit")   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: my_fit: subset_of_weights must be one of ('all', 'last_layer'), a ... got 'some'
    """
    if isinstance(spec, str) and spec in NAMES:
        return NAMES[spec](params, fn, x, last_layer_name)
    if hasattr(spec, "as_weights") and not isinstance(spec, Weights):
        spec = spec.as_weights(params, who)
    if not isinstance(spec, Weights):
        raise ValueError(f"{who}: subset_of_weights must be one of {tuple(NAMES)}, a posteriors.weights.Weights or a "
                         f"posteriors.Subnetwork, got {spec!r}")
    if isinstance(spec, Leaves):
        n = len(jax.tree_util.tree_leaves(params))
        if spec.leaves and (min(spec.leaves) < 0 or max(spec.leaves) >= n):
            raise ValueError(f"{who}: the selection's leaves {spec.leaves} are not leaves of params ({n} leaves)")
    idx = spec.indices
    if idx is not None and not _traced(idx):
        P = ravel(params)[0].shape[0]
        check_indices(np.asarray(idx), P, f"{who}(subset_of_weights={type(spec).__name__})")
    return spec


__all__ = ["AllWeights", "Indices", "Leaves", "NAMES", "Weights", "indices", "last_layer", "last_layer_leaves",
           "leaves", "path_string", "select"]
