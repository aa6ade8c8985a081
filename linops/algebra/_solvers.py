"""The solve itself, after the front end's checks: a closed form, dense LU, or conjugate gradients.

`linops.solve` validates its arguments and calls `solve_checked`; `linops.Inverse` calls it at each
product (its method was checked when `linops.inv` built it).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Inexact, Int

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import describe
from linops.algebra._cg import cg, cg_many
from linops.memory import check_fits


def closed_form(result, A, what, alternatives):
    """``result`` of a structure hook, or the error naming the explicit alternatives."""
    if result is NotImplemented:
        raise ValueError(f"{what}: {describe(A)} has no closed form here; choose a method explicitly: {alternatives}")
    return result


class Solution(eqx.Module):
    """The result of `linops.solve`.

    Attributes:
        value: the solution ``x``, shaped like ``b``.
        converged: whether the stopping rule was met, judged on the true residual (for direct
            methods: whether every entry of the solution is finite).
        num_steps: iterations taken (0 for direct methods); one per column of ``b``.
        residual_norm: ``||b - A x||`` recomputed from the returned ``x`` (NaN for direct methods:
            not measured).
    """

    value: Inexact[Array, " n *k"]
    converged: Bool[Array, " *k"]
    num_steps: Int[Array, " *k"]
    residual_norm: Inexact[Array, " *k"]


def _direct(x):
    k = () if x.ndim == 1 else (x.shape[1],)
    finite = jnp.all(jnp.isfinite(x), axis=0)  # a singular or non-finite system gives Inf/NaN: not converged
    return Solution(x, finite, jnp.zeros(k, jnp.int32), jnp.full(k, jnp.nan, x.dtype))


def solve_checked(A, b, method=None, *, rtol=None, atol=0.0, maxiter=None, preconditioner=None,
                  x0=None) -> Solution:
    """`linops.solve` without its argument checks (``b`` is an array of the right shape)."""
    if method is None:
        return _direct(closed_form(closed_forms.solve(A, b), A, "solve",
                                   "method='cg' (A tagged psd) or method='dense'"))
    if method == "dense":
        # the matrix and LU's factored copy are alive together: 2 n^2 numbers, not the n^2 of as_matrix alone
        n, k = A.shape[0], 1 if b.ndim == 1 else b.shape[1]
        check_fits((2 * n * n + 2 * n * k) * np.dtype(A.dtype).itemsize, f"solve(method='dense') of {describe(A)} "
                   "(the matrix and its LU factors)", "use method='cg' (A tagged psd) or a structured operator")
        M = A.as_matrix()
        return _direct(jnp.linalg.solve(M, b if b.ndim == 2 else b[:, None]).reshape(b.shape))
    if _tags.psd not in A.tags:
        raise ValueError(
            f"solve(method='cg'): {describe(A)} is not tagged psd (its tags: {sorted(A.tags)}); "
            "CG needs a symmetric positive definite operator. Declare it (e.g. "
            "lo.Dense(M, tags={'psd'}) or lo.shift(G, lam, nonnegative=True)) or use method='dense'"
        )
    dtype = jnp.result_type(A.dtype, b.dtype)
    b = b.astype(dtype)
    rtol = float(np.sqrt(np.finfo(dtype).eps)) if rtol is None else rtol  # NumPy: static under jit
    maxiter = 10 * A.shape[0] if maxiter is None else maxiter
    return Solution(*_cg_compiled(A, b, x0, preconditioner, rtol, atol, maxiter))


@eqx.filter_jit
def _cg_compiled(A, b, x0, preconditioner, rtol, atol, maxiter):
    """CG as one compiled program per operator structure, shapes and options: an eager `solve(method="cg")`
    traces and compiles its loop once, not at every call (under an outer `jax.jit` it is inlined)."""
    precondition = None if preconditioner is None else preconditioner.mv
    run = cg if b.ndim == 1 else cg_many
    return run(A.mv, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, precondition=precondition)
