"""Structural tags: `symmetric`, `psd`, `diagonal`, `orthogonal`, `projector`, `identity`, `zero`.

Tags are strings, so ``"psd" in A.tags`` works; declare them on leaves with
``tags={"psd"}`` and implied tags are added (``psd`` implies ``symmetric``).

Examples:
    >>> import jax.numpy as jnp, linops as lo
    >>> lo.tags.psd in lo.Dense(jnp.eye(2), tags={"psd"}).tags
    True
"""

from linops.algebra._tags import ALL, Tag, diagonal, identity, orthogonal, projector, psd, symmetric, zero

__all__ = ["ALL", "Tag", "diagonal", "identity", "orthogonal", "projector", "psd", "symmetric", "zero"]
