"""How deeply an expression nests operators, and the limit the algebra holds it to.

Chains of one composite stay flat at any length: ``A + B + ...`` is one `Sum`, ``A @ B @ ...`` one
`Product`, ``c * (d * A)`` one `Scaled`, a shift of a shift one shift. What still nests is an
alternation built in a loop, such as ``s = c * (s + A)`` or Horner's ``s = s @ A + B``: each step adds
levels, and walking them (a product, a transpose, `repr`, JAX flattening the pytree) recurses once per
level. Running into Python's recursion limit half-way through such a walk can leave the interpreter
unable to recurse at all afterwards (seen with JAX and Equinox on CPython 3.11), so the composites
refuse, when built, to nest deeper than `max_nesting` levels instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

FRAMES_PER_LEVEL = 8
"""Python frames that walking one level of an expression may take (a transpose takes about 7)."""


class ExpressionTooDeepError(RecursionError):
    """An expression would nest operators deeper than `max_nesting` levels.

    Raised when the composite is built, before anything recurses; a `RecursionError`, so code that
    catches those catches this too.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.eye(2))
        >>> s = A
        >>> try:
        ...     for _ in range(1000):
        ...         s = 0.5 * (s + A)         # two levels a step
        ... except lo.ExpressionTooDeepError:
        ...     print(lo.nesting_depth(s) <= lo.max_nesting())
        True
    """


def max_nesting() -> int:
    """The deepest nesting of operators the composites accept: 125 levels under Python's default
    recursion limit of 1000 (`sys.setrecursionlimit` raises it).

    Examples:
        >>> import sys, linops as lo
        >>> lo.max_nesting() == sys.getrecursionlimit() // 8
        True
    """
    return sys.getrecursionlimit() // FRAMES_PER_LEVEL


def nesting_depth(op) -> int:
    """The number of levels of operators in ``op``: 1 for a leaf, 1 + the deepest operand otherwise.

    Composites record theirs when built; anything else is walked with a loop, not recursion.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.eye(2))
        >>> lo.nesting_depth(A), lo.nesting_depth(A + A + A), lo.nesting_depth(2.0 * (A + A) @ A)
        (1, 2, 4)
    """
    deepest, depth, level = 0, 0, [op]
    while level:
        depth += 1
        below = {}  # by identity: an operand shared by many nodes is walked once per level
        for node in level:
            recorded = getattr(node, "__dict__", {}).get("_levels")
            if recorded is not None:
                deepest = max(deepest, depth - 1 + recorded)
                continue
            deepest = max(deepest, depth)
            # Read from the class: Equinox builds a bound-method module at each `node.children` access.
            for child in type(node).children(node):
                below[id(child)] = child
        level = list(below.values())
    return deepest


def composite_levels(what: str, operand_levels: Iterable[int]) -> int:
    """The nesting of a composite ``what`` over operands of the given nesting; raises
    `ExpressionTooDeepError` beyond `max_nesting`."""
    levels = 1 + max(operand_levels)
    if levels > max_nesting():
        raise ExpressionTooDeepError(
            f"{what}: the expression would nest operators {levels} levels deep, more than the {max_nesting()} "
            f"that Python's recursion limit ({sys.getrecursionlimit()}) lets the algebra walk. Chains of +, @, "
            "scalar * and lo.shift stay flat at any length; an alternation built in a loop (s = c * (s + A), "
            "s = s @ A + B) adds levels every step: expand it into one lo.Sum / lo.Product of its terms, or "
            f"raise sys.setrecursionlimit (the limit is a {FRAMES_PER_LEVEL}th of it)"
        )
    return levels
