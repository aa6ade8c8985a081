"""`lower` (simplify, then jit once per shape) and `explain` (the tree, its tags, its cost)."""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from linops import closed_forms
from linops.algebra._base import LinearOperator
from linops.algebra._rules import simplify


class Lowered(LinearOperator):
    """A simplified operator whose products run as one compiled XLA program per input shape.

    Built by `linops.lower`: the operator is flattened once, and each product calls a plain
    `jax.jit` program over the flat array leaves (no per-call pytree walk of the
    expression). Inside an outer `jax.jit` the program is inlined.
    """

    leaves: list
    structure: Any = eqx.field(static=True)  # (treedef of the array leaves, the non-array parts)
    op_shape: tuple = eqx.field(static=True)
    programs: tuple = eqx.field(static=True)  # (product, transposed product)

    def __init__(self, op: LinearOperator):
        dynamic, static = eqx.partition(op, eqx.is_array)
        leaves, treedef = jax.tree_util.tree_flatten(dynamic)
        self.leaves = leaves
        self.structure = (treedef, static)
        self.op_shape = tuple(op.shape)
        self.programs = _programs(treedef, static)

    @property
    def op(self) -> LinearOperator:
        """The simplified operator."""
        treedef, static = self.structure
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, self.leaves), static)

    @property
    def shape(self):
        return self.op_shape

    @property
    def dtype(self):
        return self.op.dtype

    @property
    def tags(self):
        return self.op.tags

    def signature(self):
        return self.op.signature()

    def __matmul__(self, other):
        # The eager hot path: no method lookups on the Module, one call into compiled code.
        if isinstance(other, (jax.Array, np.ndarray)) and other.ndim in (1, 2) and other.shape[0] == self.op_shape[1]:
            return self.programs[0](self.leaves, other)
        return super().__matmul__(other)

    def mv(self, v):
        return self.programs[0](self.leaves, v)

    mm = mv

    def rmv(self, u):
        return self.programs[1](self.leaves, u)

    rmm = rmv

    def transpose(self):
        return Lowered(simplify(self.op.T))



def _forwarding(function):
    def rule(op, *args):
        return function(op.op, *args)

    rule.__name__ = rule.__qualname__ = f"_lowered_{function.name}"
    return rule


# Every closed form of the simplified operator, forwarded (a function added to the table is forwarded too).
for _function in closed_forms.FUNCTIONS:
    _function.register(Lowered, _forwarding(_function))


def _make_programs(treedef, static):
    def rebuild(leaves):
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, leaves), static)

    def forward(leaves, x):
        op = rebuild(leaves)
        return op.mv(x) if x.ndim == 1 else op.mm(x)

    def backward(leaves, x):
        op = rebuild(leaves)
        return op.rmv(x) if x.ndim == 1 else op.rmm(x)

    return jax.jit(forward), jax.jit(backward)


@functools.lru_cache(maxsize=128)
def _cached_programs(treedef, static):
    return _make_programs(treedef, static)


def _programs(treedef, static):
    """One pair of compiled programs per expression structure (lowering twice, or lowering a freshly built
    operator of the same structure, reuses them). Bounded: a process meets only so many structures."""
    try:
        return _cached_programs(treedef, static)
    except TypeError:  # an unhashable static part: no sharing
        return _make_programs(treedef, static)


def lower(expr: LinearOperator) -> Lowered:
    """Simplify ``expr`` and compile its products (once per input shape).

    The program is shared by every operator of the same structure, shapes and dtypes: a freshly
    built operator (a new one every step, say) reuses it, since no operator's identity is part of its
    static structure (`LinearOperator.signature`).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> L = lo.lower(lo.Identity(2) @ A.T.T)
        >>> L @ jnp.ones(2)
        Array([3., 7.], dtype=float32)
    """
    return Lowered(simplify(expr))


def _count(jaxpr, name: str) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            total += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex_core.ClosedJaxpr):
                    total += _count(sub.jaxpr, name)
                elif isinstance(sub, jex_core.Jaxpr):
                    total += _count(sub, name)
    return total


def count_matmuls(op: LinearOperator) -> int:
    """The number of ``dot_general`` operations in the program of ``op @ v``.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.eye(3))
        >>> lo.count_matmuls(A @ A), lo.count_matmuls(lo.simplify(lo.Identity(3) @ A))
        (2, 1)
    """
    v = jnp.zeros(op.shape[1], op.dtype)
    return _count(jax.make_jaxpr(op.mv)(v).jaxpr, "dot_general")


class Explanation(str):
    """A multi-line report that displays as itself."""

    def __repr__(self) -> str:
        return str(self)


def _tree(op: LinearOperator, prefix: str = "", last: bool = True, root: bool = True) -> list[str]:
    tags = ", ".join(sorted(op.tags))
    head = f"{type(op).__name__}{tuple(op.shape)}" + (f" [{tags}]" if tags else "")
    lines = [head if root else prefix + ("└─ " if last else "├─ ") + head]
    kids = op.children()
    child_prefix = "" if root else prefix + ("   " if last else "│  ")
    for i, c in enumerate(kids):
        lines += _tree(c, child_prefix, i == len(kids) - 1, root=False)
    return lines


def explain(expr: LinearOperator) -> Explanation:
    """The simplified tree with tags, and the matrix products before and after simplifying.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> J = lo.Dense(jnp.ones((2, 3)))
        >>> lo.explain(J.T @ lo.Diagonal(jnp.ones(2)) @ J)
        Product(3, 3) [psd, symmetric]
        ├─ Transpose(3, 2)
        │  └─ Dense(2, 3)
        ├─ Diagonal(2, 2) [diagonal, psd, symmetric]
        └─ Dense(2, 3)
        matrix products: 2 as written, 2 after simplify
    """
    simple = simplify(expr)
    lines = _tree(simple)
    lines.append(f"matrix products: {count_matmuls(expr)} as written, {count_matmuls(simple)} after simplify")
    return Explanation("\n".join(lines))
