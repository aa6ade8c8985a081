"""Memory pre-flight: estimate what a request needs and refuse it, before any work, if it cannot fit.

`as_matrix()` checks itself (a ``P x P`` GGN of a 100k-parameter network is 40 GB); for
products, `program_bytes` reads XLA's own memory analysis of the compiled program.

Examples:
    >>> import jax.numpy as jnp, linops as lo
    >>> huge = lo.FunctionOp(lambda v: v, (10**6, 10**6), jnp.float32)
    >>> lo.memory.dense_bytes(huge)
    4000000000000
    >>> huge.as_matrix()
    Traceback (most recent call last):
    ...
    linops.memory.MemoryBudgetError: FunctionOp(1000000, 1000000).as_matrix() needs 4.0 TB ...
"""

from __future__ import annotations

import jax
import numpy as np

from linops.algebra._arrays import describe


class MemoryBudgetError(MemoryError):
    """A request was refused because it would not fit in the available memory.

    Examples:
        >>> from linops.memory import MemoryBudgetError, check_fits
        >>> try:
        ...     check_fits(10**12, "a big request", "ask for less", limit=10**9)
        ... except MemoryBudgetError as e:
        ...     print(e)
        a big request needs 1.0 TB but only 1.0 GB are available; ask for less
    """


def format_bytes(n: float) -> str:
    """``4.0 GB``-style sizes (powers of 1000).

    Examples:
        >>> from linops.memory import format_bytes
        >>> format_bytes(4 * 10**9)
        '4.0 GB'
    """
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError("unreachable")


def available_bytes(device=None) -> int | None:
    """Free memory of ``device`` (default: JAX's first device), or None when it cannot be read.

    GPU/TPU: the allocator's limit minus what is in use. CPU: ``MemAvailable`` from
    ``/proc/meminfo`` (Linux).

    Examples:
        >>> from linops.memory import available_bytes
        >>> free = available_bytes()
        >>> free is None or free > 0
        True
    """
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def dense_bytes(op) -> int:
    """Bytes of ``op``'s dense matrix.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.memory.dense_bytes(lo.Identity(1000, jnp.float32))
        4000000
    """
    m, n = op.shape
    return int(m) * int(n) * np.dtype(op.dtype).itemsize


def program_bytes(op, num_vectors: int | None = None) -> int:
    """Bytes XLA reserves to run ``op @ v`` (``num_vectors`` columns, or one vector).

    Arguments, outputs and temporaries, from the compiled program's memory analysis (it
    compiles the program, but runs nothing).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.memory.program_bytes(lo.Dense(jnp.eye(100))) >= 100 * 100 * 4
        True
    """
    n = op.shape[1]
    shape = (n,) if num_vectors is None else (n, int(num_vectors))
    v = jax.ShapeDtypeStruct(shape, op.dtype)
    compiled = jax.jit(lambda A, x: A @ x).lower(op, v).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:  # pragma: no cover - backends without an analysis
        raise NotImplementedError("this JAX backend gives no memory analysis of compiled programs")
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes)


def check_fits(nbytes: int, what: str, alternative: str, *, limit: int | None = None) -> None:
    """Raise `MemoryBudgetError` when ``nbytes`` exceed ``limit`` (default: `available_bytes`).

    Examples:
        >>> from linops.memory import check_fits
        >>> check_fits(10, "a small request", "", limit=100)   # fits: returns None
    """
    limit = available_bytes() if limit is None else limit
    if limit is not None and nbytes > limit:
        raise MemoryBudgetError(
            f"{what} needs {format_bytes(nbytes)} but only {format_bytes(limit)} are available; {alternative}"
        )


def check_dense(op, *, limit: int | None = None) -> None:
    """Refuse ``op.as_matrix()`` when the dense matrix would not fit.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.memory.check_dense(lo.Identity(3))   # 36 bytes: fine
    """
    check_fits(
        dense_bytes(op),
        f"{describe(op)}.as_matrix()",
        "apply the operator to vectors (A @ V) or use lo.diag, lo.trace or a low-rank factor instead",
        limit=limit,
    )


__all__ = [
    "MemoryBudgetError", "available_bytes", "check_dense", "check_fits", "dense_bytes", "format_bytes",
    "program_bytes",
]
