"""Sample-parallel products: the columns of a block of vectors split over the devices of a mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linops.algebra._arrays import describe
from linops.algebra._base import LinearOperator


def sharded_mm(A: LinearOperator, V, mesh, axis: str = "data"):
    r"""``A @ V`` with the columns of ``V`` split over the devices of ``mesh`` along ``axis``.

    Each device applies ``A`` (replicated: its arrays are copied to every device) to its share of the
    columns, so independent products run in parallel: posterior samples through a projection, the probes
    of a trace estimate. The result equals ``A.mm(V)`` up to float round-off; columns left over by an
    uneven split (fewer than the number of devices) are applied on their own. An iterative ``A``
    (alternating projections by CG) runs its iteration per device, stopping when that device's columns
    have converged.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np, linops as lo
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()), ("data",))          # however many devices there are
        >>> A = lo.Diagonal(jnp.array([1.0, 2.0, 3.0]))
        >>> lo.sharded_mm(A, jnp.ones((3, 4)), mesh)[:, 0]
        Array([1., 2., 3.], dtype=float32)
    """
    from jax.sharding import Mesh, PartitionSpec

    if not isinstance(A, LinearOperator):
        raise TypeError(f"sharded_mm: A must be a LinearOperator, got {type(A).__name__}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"sharded_mm: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise ValueError(f"sharded_mm: mesh has axes {tuple(mesh.axis_names)}; {axis!r} is not one of them")
    if getattr(A, "mesh", None) is not None:
        raise ValueError(f"sharded_mm: {describe(A)} already runs on a mesh of its own; apply it directly "
                         "(A @ V), which splits the work over that mesh")
    V = jnp.asarray(V)
    if V.ndim != 2 or V.shape[0] != A.shape[1]:
        raise ValueError(f"sharded_mm: {describe(A)} needs V of shape ({A.shape[1]}, k), got {V.shape}")
    k = V.shape[1]
    even = (k // mesh.shape[axis]) * mesh.shape[axis]
    parts = []
    if even:
        spec = PartitionSpec(None, axis)
        parts.append(jax.shard_map(lambda block: A.mm(block), mesh=mesh, in_specs=(spec,), out_specs=spec,
                                   check_vma=False)(V[:, :even]))
    if even < k:
        parts.append(A.mm(V[:, even:]))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


__all__ = ["sharded_mm"]
