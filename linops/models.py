"""The model contract and adapters.

A model is a per-example function ``fn(params, x) -> (O,)`` and a params pytree. The
neural-network operators ravel params at the boundary (`ravel`); these adapters produce
``(fn, params)`` from the libraries people train with.

Examples:
    >>> import jax, equinox as eqx
    >>> from linops.models import from_equinox, ravel
    >>> fn, params = from_equinox(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0)))
    >>> flat, unravel = ravel(params)
    >>> fn(params, jax.numpy.ones(3)).shape, flat.shape
    ((2,), (50,))
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree


class Unravel:
    """The way back from a flat vector to a params pytree: equal (and hashed alike) for pytrees of one
    structure, shapes and dtypes, so that a jitted function taking it as static data compiles once per
    structure, not once per `ravel` call (a fresh closure would never compare equal).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import ravel
        >>> _, u1 = ravel({"w": jnp.ones((2, 2))}); _, u2 = ravel({"w": jnp.zeros((2, 2))})
        >>> u1 == u2, u1(jnp.arange(4.0))["w"].shape
        (True, (2, 2))
    """

    __slots__ = ("treedef", "shapes", "dtypes", "_key")

    def __init__(self, treedef, shapes, dtypes):
        self.treedef, self.shapes, self.dtypes = treedef, tuple(shapes), tuple(dtypes)
        self._key = (treedef, self.shapes, self.dtypes)

    @property
    def size(self) -> int:
        """The length of the flat vector."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def dtype(self):
        """The flat vector's dtype (the leaves' common one)."""
        return jnp.result_type(*self.dtypes) if self.dtypes else jnp.dtype(jnp.float32)

    def __call__(self, flat):
        flat = jnp.asarray(flat)
        sizes = [math.prod(s) for s in self.shapes]
        if flat.shape != (sum(sizes),):
            raise ValueError(f"unravel: expected a flat vector of shape ({sum(sizes)},), got {flat.shape}")
        if not isinstance(flat, jax.core.Tracer):  # called eagerly: one compiled program per structure, not
            return _unravel_program(self, flat)  # a split, a reshape and a cast per leaf, each its own program
        return self._unravel(flat)

    def _unravel(self, flat):
        sizes = [math.prod(s) for s in self.shapes]
        parts = jnp.split(flat, np.cumsum(sizes)[:-1]) if len(sizes) > 1 else [flat]
        leaves = [p.reshape(s).astype(d) for p, s, d in zip(parts, self.shapes, self.dtypes, strict=True)]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def __eq__(self, other):
        return isinstance(other, Unravel) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"Unravel({len(self.shapes)} leaves, {sum(math.prod(s) for s in self.shapes)} numbers)"


def ravel(params):
    """``(flat, unravel)``: the params pytree as one vector, and the way back (an `Unravel`).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import ravel
        >>> flat, unravel = ravel({"w": jnp.ones((2, 2)), "b": jnp.zeros(2)})
        >>> flat.shape, unravel(flat)["w"].shape
        ((6,), (2, 2))
    """
    traced = any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(params))
    flat = ravel_pytree(params)[0] if traced else _ravel_program(params)  # eagerly: one program, not one per leaf
    return flat, unravel_of(params)


# `ravel` and `Unravel` called eagerly (outside a trace): each would otherwise run a reshape, a cast and a slice
# per leaf as single operations, each compiled on its own the first time (27 ms each at XLA's default optimisation
# level on 2 cores: 0.7 s for a ten-leaf model, against one small program).
_ravel_program = jax.jit(lambda params: ravel_pytree(params)[0])
_unravel_program = jax.jit(lambda unravel, flat: unravel._unravel(flat), static_argnums=0)


def unravel_of(params) -> Unravel:
    """The `Unravel` of ``params`` (its ``size`` and ``dtype`` are the flat vector's), computing nothing: no
    flat vector is formed, so no program runs or compiles (`ravel` concatenates the leaves).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import unravel_of
        >>> u = unravel_of({"w": jnp.ones((2, 2)), "b": jnp.zeros(2)})
        >>> u.size, u.dtype
        (6, dtype('float32'))
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    return Unravel(treedef, [jnp.shape(a) for a in leaves], [jnp.result_type(a) for a in leaves])


def example_spec(data):
    """One example of ``data`` (a pytree of arrays with a leading example axis) as `jax.ShapeDtypeStruct`
    leaves: what `jax.eval_shape` and tracing need to know of an example, without slicing one (indexing a
    concrete array runs, and so compiles, a program of its own).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import example_spec
        >>> example_spec(jnp.zeros((100, 28, 28)))
        ShapeDtypeStruct(shape=(28, 28), dtype=float32)
    """
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a)[1:], jnp.result_type(a)), data)


class BoundModel:
    """A per-example model function ``fn(params, x) = apply(params, static, x)``, with the module's
    non-trainable part ``static`` held, not closed over: what `from_equinox` and `from_flax_nnx` return.

    Two are equal (and hash alike) when they apply the same way to equal static parts: the same pytree
    structure and the same non-array leaves, array leaves (a frozen embedding, batch statistics) by
    identity. Compiled programs take the model function as static data, so a model wrapped again after
    more training reuses every program compiled for it; a new closure never would. A static part whose
    structure cannot be hashed compares by identity, as a closure does.

    Examples:
        >>> import jax, equinox as eqx
        >>> from linops.models import BoundModel, from_equinox
        >>> fn, params = from_equinox(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0)))
        >>> isinstance(fn, BoundModel), fn == from_equinox(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(1)))[0]
        (True, True)
        >>> fn == from_equinox(eqx.nn.MLP(3, 2, 16, 1, key=jax.random.key(0)))[0]   # another width
        False
    """

    __slots__ = ("apply", "static", "_key", "__weakref__")

    def __init__(self, apply: Callable, static):
        self.apply, self.static = apply, static
        leaves, treedef = jax.tree_util.tree_flatten(static)
        key = (apply, treedef, tuple(_leaf_key(leaf) for leaf in leaves))
        try:
            hash(key)
        except TypeError:  # an unhashable static field: identity, as a closure
            key = (apply, id(self))
        self._key = key

    def __call__(self, params, x):
        return self.apply(params, self.static, x)

    def __eq__(self, other):
        return isinstance(other, BoundModel) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"BoundModel({getattr(self.apply, '__name__', self.apply)})"


def _leaf_key(leaf):
    """A static leaf as part of a `BoundModel`'s key: arrays by identity, hashable values by value."""
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return ("array", id(leaf))
    try:
        hash(leaf)
    except TypeError:
        return ("object", id(leaf))
    return type(leaf), leaf  # 1 and 1.0 trace differently


def _equinox_apply(params, static, x):
    return eqx.combine(params, static)(x)


def _nnx_apply(params, static, x):
    from flax import nnx

    graphdef, rest = static
    return nnx.merge(graphdef, params, rest)(x)


def from_equinox(module) -> tuple[Callable, object]:
    """``(fn, params)`` for an Equinox module called on one example: ``module(x)``.

    The trainable arrays (inexact arrays) are the params; everything else is held by ``fn`` (a
    `BoundModel`). Wrapping the same architecture again (after more training, say) gives an equal ``fn``,
    so every program compiled for the first one is reused.

    Examples:
        >>> import jax, equinox as eqx
        >>> from linops.models import from_equinox
        >>> fn, params = from_equinox(eqx.nn.Linear(2, 3, key=jax.random.key(0)))
        >>> fn(params, jax.numpy.ones(2)).shape
        (3,)
        >>> fn == from_equinox(eqx.nn.Linear(2, 3, key=jax.random.key(1)))[0]   # new weights, same model
        True
    """
    params, static = eqx.partition(module, eqx.is_inexact_array)
    return BoundModel(_equinox_apply, static), params


def from_flax_nnx(module) -> tuple[Callable, object]:
    """``(fn, params)`` for a Flax NNX module called on one example (needs ``flax``).

    Examples:
        >>> from linops.models import from_flax_nnx   # doctest: +SKIP
        >>> fn, params = from_flax_nnx(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))  # doctest: +SKIP
    """
    try:
        from flax import nnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("from_flax_nnx needs flax (pip install flax)") from e
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    return BoundModel(_nnx_apply, (graphdef, rest)), params


def per_example(batched_fn: Callable) -> Callable:
    """Turn ``batched_fn(params, X) -> (N, O)`` into the per-example ``fn(params, x) -> (O,)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import per_example
        >>> fn = per_example(lambda p, X: X @ p)
        >>> fn(jnp.ones((3, 2)), jnp.arange(3.0))
        Array([3., 3.], dtype=float32)
    """

    def fn(params, x):
        return batched_fn(params, jax.tree_util.tree_map(lambda a: a[None], x))[0]

    return fn


def check_indices(indices, num_params: int, who: str):
    """``indices`` as a sorted int array, or a `ValueError` naming ``who`` (range, repeats, shape).

    Examples:
        >>> from linops.models import check_indices
        >>> check_indices([4, 0, 2], num_params=5, who="my_subnet")
        array([0, 2, 4])
        >>> check_indices([0, 5], num_params=5, who="my_subnet")
        Traceback (most recent call last):
        ...
        ValueError: my_subnet: indices must lie in [0, 5) for 5 parameters, got range [0, 5]
    """
    import numpy as np

    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{who}: indices must be a non-empty 1-D integer array, got {idx.dtype}{idx.shape}")
    if idx.min() < 0 or idx.max() >= num_params:
        raise ValueError(f"{who}: indices must lie in [0, {num_params}) for {num_params} parameters, got range "
                         f"[{idx.min()}, {idx.max()}]")
    if np.unique(idx).size != idx.size:
        raise ValueError(f"{who}: indices contain {idx.size - np.unique(idx).size} duplicates; a subset lists each "
                         "parameter once")
    return np.sort(idx)


def restrict(fn: Callable, params, indices) -> tuple[Callable, jax.Array]:
    r"""The model as a function of a subset of its flat parameters: ``(fn_S, theta_S)``.

    ``fn_S(v, x)`` is ``fn`` with the flat parameters at ``indices`` (sorted) replaced by ``v``
    and every other parameter held at its value in ``params``. Only the leaves that contain a
    selected index depend on ``v`` (each by one scatter); the others are closed over, so
    forward- and reverse-mode derivatives of ``fn_S`` never propagate through them: the
    Jacobian $J E_s$ of a parameter subset is computed directly, never sliced from the full one.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import restrict
        >>> fn = lambda p, x: p["a"] * x + p["b"]
        >>> fn_S, v = restrict(fn, {"a": jnp.array([2.0, 3.0]), "b": jnp.zeros(2)}, [1])
        >>> v, fn_S(jnp.array([10.0]), jnp.ones(2))       # only a[1] is free
        (Array([3.], dtype=float32), Array([ 2., 10.], dtype=float32))
    """
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten(params)
    sizes = [int(np.size(leaf)) for leaf in leaves]
    idx = check_indices(indices, sum(sizes), "restrict")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    leaf_of = np.searchsorted(starts, idx, side="right") - 1
    touched = {int(i): (idx[leaf_of == i] - starts[i], np.nonzero(leaf_of == i)[0]) for i in np.unique(leaf_of)}
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        values = ravel(params)[0][idx]
    else:  # gathered on the host and moved once: eager indexing would compile programs of its own
        host = [np.asarray(leaves[i]).reshape(-1)[local] for i, (local, _) in touched.items()]  # idx is sorted
        values = jax.device_put(np.concatenate(host).astype(unravel_of(params).dtype))

    def fn_S(v, x):
        full = list(leaves)
        for i, (local, pos) in touched.items():
            full[i] = leaves[i].reshape(-1).at[local].set(v[pos].astype(leaves[i].dtype)).reshape(leaves[i].shape)
        return fn(jax.tree_util.tree_unflatten(treedef, full), x)

    return fn_S, values


def shard(params, mesh, axis: str = "model"):
    """``params`` placed over ``mesh``'s ``axis`` (model parallel): each leaf split along its largest axis whose
    length the axis's device count divides, a leaf with no such axis replicated. The operators and posteriors
    take sharded parameters as they are: their compiled programs keep the parameters, a diagonal and the samples
    split the same way (XLA's partitioner), so that each device holds its share.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec
        >>> from linops.models import shard
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> placed = shard({"W": jnp.ones((4, 3)), "b": jnp.zeros(3)}, mesh)
        >>> placed["W"].sharding.spec == PartitionSpec("model", None)     # split along its longest axis
        True
    """
    from jax.sharding import NamedSharding, PartitionSpec

    if axis not in mesh.axis_names:
        raise ValueError(f"shard: the mesh has no axis {axis!r} (its axes: {mesh.axis_names})")
    size = mesh.shape[axis]

    def place(leaf):
        leaf = jnp.asarray(leaf)
        for dim in sorted(range(leaf.ndim), key=lambda d: -leaf.shape[d]):
            if leaf.shape[dim] % size == 0 and leaf.shape[dim] >= size:
                spec = [None] * leaf.ndim
                spec[dim] = axis
                return jax.device_put(leaf, NamedSharding(mesh, PartitionSpec(*spec)))
        return jax.device_put(leaf, NamedSharding(mesh, PartitionSpec()))

    return jax.tree_util.tree_map(place, params)


def num_shards(params) -> int:
    """The most devices any leaf of ``params`` is split over (1: every leaf whole on each device that holds it).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.models import num_shards
        >>> num_shards({"W": jnp.ones((4, 3))})
        1
    """
    counts = [1]
    for leaf in jax.tree_util.tree_leaves(params):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and not isinstance(leaf, jax.core.Tracer) and not sharding.is_fully_replicated:
            pieces = {tuple((i.start, i.stop) for i in index)
                      for index in sharding.devices_indices_map(leaf.shape).values()}
            counts.append(len(pieces))
    return max(counts)


__all__ = ["BoundModel", "Unravel", "check_indices", "example_spec", "from_equinox", "num_shards", "shard",
           "from_flax_nnx", "per_example", "ravel", "restrict", "unravel_of"]
