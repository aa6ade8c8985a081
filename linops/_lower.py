"""`lower` (simplify, then jit once per shape) and `explain` (the tree, its tags, its cost)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from linops._base import LinearOperator
from linops._rules import simplify


@eqx.filter_jit
def _jit_apply(op, x):
    return op.mv(x) if x.ndim == 1 else op.mm(x)


@eqx.filter_jit
def _jit_apply_t(op, x):
    return op.rmv(x) if x.ndim == 1 else op.rmm(x)


class Lowered(LinearOperator):
    """A simplified operator whose products run as one compiled XLA program per shape.

    Built by `linops.lower`. Inside an outer `jax.jit` the inner jit is inlined.
    """

    op: LinearOperator

    @property
    def shape(self):
        return tuple(self.op.shape)

    @property
    def dtype(self):
        return self.op.dtype

    @property
    def tags(self):
        return self.op.tags

    def signature(self):
        return self.op.signature()

    def mv(self, v):
        return _jit_apply(self.op, v)

    mm = mv

    def rmv(self, u):
        return _jit_apply_t(self.op, u)

    rmm = rmv

    def transpose(self):
        return Lowered(simplify(self.op.T))

    def _diag(self):
        return self.op._diag()

    def _solve(self, b):
        return self.op._solve(b)

    def _logdet(self):
        return self.op._logdet()

    def _sqrt(self):
        return self.op._sqrt()

    def _pinv(self, rtol):
        return self.op._pinv(rtol)

    def _eigh(self):
        return self.op._eigh()

    def _trace(self):
        return self.op._trace()


def lower(expr: LinearOperator) -> Lowered:
    """Simplify ``expr`` and compile its products (once per input shape).

    Example:
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

    Example:
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

    Example:
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
