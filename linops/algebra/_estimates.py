"""Stochastic estimates with their standard errors: `Estimate` and Hutchinson's trace estimator."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Inexact, PRNGKeyArray

from linops.algebra._base import LinearOperator, check_operator, check_square


class Estimate(eqx.Module):
    """A Monte Carlo estimate with its standard error, printed with its numbers: what `linops.hutchinson`,
    ``lo.trace(A, method="hutchinson")`` (a scalar) and ``lo.diag(A, method="hutchinson")`` (one value and one
    standard error per entry) return.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> est = lo.diag(lo.Dense(jnp.array([[2.0, 1.0], [1.0, 3.0]])), method="hutchinson",
        ...               key=jax.random.key(0), num_samples=400)
        >>> est.value.shape, bool(jnp.all(jnp.abs(est.value - jnp.array([2.0, 3.0])) < 4 * est.standard_error))
        ((2,), True)
    """

    value: Inexact[Array, "*shape"]
    standard_error: Float[Array, "*shape"]
    num_samples: int = eqx.field(static=True)

    def __repr__(self):
        def number(a):
            if isinstance(a, jax.core.Tracer) or getattr(a, "ndim", 0) != 0:
                return repr(a)  # traced, or batched (vmapped): no single number to show
            return f"{float(a):.6g}"

        return (f"Estimate(value={number(self.value)}, standard_error={number(self.standard_error)}, "
                f"num_samples={self.num_samples})")


def rademacher(key, A, num_samples, what):
    if key is None:
        raise ValueError(f"{what}: a stochastic estimate needs an explicit PRNG key (key=jax.random.key(0))")
    if num_samples < 2:
        raise ValueError(f"{what}: num_samples must be >= 2 to report a standard error, got {num_samples}")
    # drawn flat, the same values: XLA:CPU compiles that faster (linops.runtime.flat_draw)
    return jax.random.rademacher(key, (A.shape[1] * num_samples,), dtype=A.dtype).reshape(A.shape[1], num_samples)


def hutchinson(A: LinearOperator, key: PRNGKeyArray | None, num_samples: int = 64, *, mesh=None,
               axis: str = "data") -> Estimate:
    r"""Hutchinson's trace estimate $\frac1s \sum_i z_i^\top A z_i$ with Rademacher $z_i$.

    Returns the estimate and its standard error (sample standard deviation over $\sqrt s$). With a
    ``mesh`` (a `jax.sharding.Mesh`), the probes are split over its devices along ``axis``
    (`sharded_mm`); the estimate is the same as without.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> est = lo.hutchinson(lo.Diagonal(jnp.arange(4.0)), jax.random.key(0), 16)
        >>> est.value, est.standard_error   # exact for a diagonal operator
        (Array(6., dtype=float32), Array(0., dtype=float32))
        >>> est
        Estimate(value=6, standard_error=0, num_samples=16)
    """
    check_operator(A, "hutchinson")
    check_square(A, "hutchinson")
    Z = rademacher(key, A, num_samples, "hutchinson")
    if mesh is None:
        AZ = A.mm(Z)
    else:
        from linops.algebra._sharding import sharded_mm

        AZ = sharded_mm(A, Z, mesh, axis)
    samples = jnp.sum(Z * AZ, axis=0)
    return Estimate(jnp.mean(samples), jnp.std(samples, ddof=1) / jnp.sqrt(num_samples), num_samples)


__all__ = ["Estimate", "hutchinson", "rademacher"]
