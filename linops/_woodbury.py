r"""Closed forms for diagonal-plus-low-rank sums $D + U C V^\top$ (Woodbury, determinant lemma).

Sums of `Identity`, `Diagonal`, `LowRank` and their scalings are recognised; nothing
``n x n`` is ever formed. The ``k x k`` capacitance is $K = I + V^\top D^{-1} U C$, which
stays well-defined when entries of $C$ are zero (no $C^{-1}$ is needed).
"""

from __future__ import annotations

import jax.numpy as jnp

from linops import _tags
from linops._composite import Scaled, Sum
from linops._leaves import Diagonal, Identity, Zero
from linops._structured import LowRank


def _terms(op, scale=1.0):
    """Yield ``(kind, scale, leaf)`` for the flattened terms of a sum, or raise KeyError."""
    if isinstance(op, Sum):
        for t in op.terms:
            yield from _terms(t, scale)
    elif isinstance(op, Scaled):
        yield from _terms(op.op, scale * op.scalar)
    elif isinstance(op, (Identity, Diagonal, LowRank, Zero)):
        # The base kind, so subclasses (e.g. LanczosLowRankOp) take their parent's closed forms.
        yield next(k for k in (LowRank, Diagonal, Identity, Zero) if isinstance(op, k)), scale, op
    else:
        raise KeyError(type(op).__name__)


def split(op):
    """``(D, [(U, c, V, leaf), ...], scalar_D)`` for a diagonal-plus-low-rank sum, else None.

    ``D`` is an ``(n,)`` vector (or a scalar when ``scalar_D``). None when a term is of
    another kind or when there is no diagonal part (no closed form: a sum of low-rank
    terms alone is singular whenever its rank is below ``n``).
    """
    try:
        terms = list(_terms(op))
    except KeyError:
        return None
    D, scalar_D, lowrank = None, True, []
    for kind, c, leaf in terms:
        if kind is Zero:
            continue
        if kind is LowRank:
            lowrank.append((leaf.U, c * leaf.d, leaf.Vm, leaf))
            continue
        part = c if kind is Identity else c * leaf.d
        scalar_D = scalar_D and kind is Identity
        D = part if D is None else D + part
    if D is None:
        return None
    return D, lowrank, scalar_D


def _capacitance(D, lowrank):
    U = jnp.concatenate([u for u, _, _, _ in lowrank], axis=1)
    c = jnp.concatenate([jnp.broadcast_to(ci, (u.shape[1],)) for u, ci, _, _ in lowrank])
    V = jnp.concatenate([v for _, _, v, _ in lowrank], axis=1)
    DinvU = U / (D[:, None] if jnp.ndim(D) else D)
    K = jnp.eye(c.shape[0], dtype=U.dtype) + (V.T @ DinvU) * c[None, :]
    return DinvU, c, V, K


def solve(op, b):
    parts = split(op)
    if parts is None:
        return NotImplemented
    D, lowrank, _ = parts
    Dcol = D if jnp.ndim(D) == 0 or b.ndim == 1 else D[:, None]
    Z = b / Dcol
    if not lowrank:
        return Z
    DinvU, c, V, K = _capacitance(D, lowrank)
    inner = jnp.linalg.solve(K, V.T @ Z if b.ndim == 2 else (V.T @ Z)[:, None])
    inner = inner if b.ndim == 2 else inner[:, 0]
    return Z - DinvU @ (c[:, None] * inner if b.ndim == 2 else c * inner)


def logdet(op):
    parts = split(op)
    if parts is None:
        return NotImplemented
    D, lowrank, scalar_D = parts
    n = op.shape[0]
    log_det_D = n * jnp.log(jnp.abs(D)) if scalar_D else jnp.sum(jnp.log(jnp.abs(D)))
    if not lowrank:
        return log_det_D
    _, _, _, K = _capacitance(D, lowrank)
    return log_det_D + jnp.linalg.slogdet(K)[1]


def sqrt(op):
    r"""The principal square root of $cI + U \operatorname{diag}(d) U^\top$ with orthonormal $U$.

    It is $\sqrt{c} I + U \operatorname{diag}(\sqrt{c+d} - \sqrt{c}) U^\top$. Needs one
    symmetric low-rank term with orthonormal ``U`` and a PSD sum.
    """
    parts = split(op)
    if parts is None or _tags.psd not in op.tags:
        return NotImplemented
    D, lowrank, scalar_D = parts
    n = op.shape[0]
    if not lowrank:
        return Diagonal(jnp.sqrt(jnp.broadcast_to(D, (n,))), nonnegative=True)
    if not scalar_D or len(lowrank) != 1:
        return NotImplemented
    U, d, V, leaf = lowrank[0]
    if not (leaf.symmetric and leaf.orthonormal):
        return NotImplemented
    rc = jnp.sqrt(D)
    return Sum((Scaled(rc, Identity(n, op.dtype), nonnegative=True),
                LowRank(U, jnp.sqrt(jnp.clip(D + d, 0.0)) - rc, orthonormal=True)))
