r"""Closed forms for diagonal-plus-low-rank sums $D + U C V^\top$ (Woodbury, determinant lemma), and for
$sB + U C V^\top$ with one operator $B$ of any other kind that has its own closed-form solve and
log-determinant (a Kronecker product, a factorised or eigen-decomposed matrix; an unfactorised `Dense`
is not taken: `linops.factorize` it first).

A sum's terms say what they are through `linops.closed_forms.woodbury_part` (a diagonal, a low-rank
term, zero; `Identity`, `Diagonal`, the low-rank operators (`AbstractLowRank`), `Zero` implement it); sums and
scalings of such terms are recognised, and nothing ``n x n`` is ever formed. The ``k x k``
capacitance is $K = I + V^\top D^{-1} U C$, which stays well-defined when entries of $C$ are
zero (no $C^{-1}$ is needed).
"""

from __future__ import annotations

import jax.numpy as jnp

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._composite import Scaled, Sum
from linops.algebra._leaves import Dense, Diagonal, Identity
from linops.algebra._lowrank import LowRank
from linops.algebra._products import Product
from linops.algebra._structured import Selection


def _terms(op, scale=1.0):
    """Yield ``(part, scale)`` for the flattened terms of a sum (``part`` from
    `linops.closed_forms.woodbury_part`), or raise KeyError for a term that is none of them."""
    if isinstance(op, Sum):
        for t in op.terms:
            yield from _terms(t, scale)
    elif isinstance(op, Scaled):
        yield from _terms(op.op, scale * op.scalar)
    else:
        part = closed_forms.woodbury_part(op)
        if part is NotImplemented:
            raise KeyError(type(op).__name__)
        yield part, scale


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
    for (kind, *value), c in terms:
        if kind == "zero":
            continue
        if kind == "lowrank":
            leaf = value[0]
            lowrank.append((leaf.U, c * leaf.d, leaf.Vm, leaf))
            continue
        part = c * value[0]
        scalar_D = scalar_D and jnp.ndim(value[0]) == 0
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
    return _correct(Z, *_capacitance(D, lowrank))


def _correct(Z, AinvU, c, V, K):
    r"""$A^{-1}b - A^{-1}U C K^{-1} V^\top A^{-1} b$ from $Z = A^{-1}b$ (a vector or a matrix of columns)."""
    inner = jnp.linalg.solve(K, V.T @ Z if Z.ndim == 2 else (V.T @ Z)[:, None])
    inner = inner if Z.ndim == 2 else inner[:, 0]
    return Z - AinvU @ (c[:, None] * inner if Z.ndim == 2 else c * inner)


def _base_split(op):
    r"""``(B, s, lowrank)`` for a sum $sB + \sum_j U_j C_j V_j^\top$ whose one other term $B$ is neither diagonal,
    low rank nor zero, else None (two such terms, a diagonal beside $B$, or no low-rank term)."""
    if not isinstance(op, Sum):
        return None
    base, lowrank = [], []

    def visit(term, scale):
        if isinstance(term, Sum):
            return all(visit(t, scale) for t in term.terms)
        if isinstance(term, Scaled):
            return visit(term.op, scale * term.scalar)
        part = closed_forms.woodbury_part(term)
        if part is NotImplemented:
            base.append((term, scale))
            return len(base) == 1
        kind, *value = part
        if kind == "lowrank":
            leaf = value[0]
            lowrank.append((leaf.U, scale * leaf.d, leaf.Vm, leaf))
        return kind in ("zero", "lowrank")

    # An unfactorised dense B is left to the explicit methods: its solve would factorise n x n at every call, as
    # method="dense" does on the whole sum (`linops.factorize` it once to take this path).
    if not visit(op, 1.0) or not base or not lowrank or isinstance(base[0][0], Dense):
        return None
    return base[0][0], base[0][1], lowrank


def _base_capacitance(B, s, lowrank):
    r"""``(A^{-1}U, c, V, K)`` for $A = sB$, from $B$'s own solve with the columns of $U$; None without one."""
    U = jnp.concatenate([u for u, _, _, _ in lowrank], axis=1)
    BinvU = closed_forms.solve(B, U)
    if BinvU is NotImplemented:
        return None
    c = jnp.concatenate([jnp.broadcast_to(ci, (u.shape[1],)) for u, ci, _, _ in lowrank])
    V = jnp.concatenate([v for _, _, v, _ in lowrank], axis=1)
    AinvU = BinvU / s
    return AinvU, c, V, jnp.eye(c.shape[0], dtype=U.dtype) + (V.T @ AinvU) * c[None, :]


def base_solve(op, b):
    """Woodbury around an operator with its own closed-form solve."""
    parts = _base_split(op)
    if parts is None:
        return NotImplemented
    B, s, lowrank = parts
    Z, cap = closed_forms.solve(B, b), _base_capacitance(B, s, lowrank)
    if Z is NotImplemented or cap is None:
        return NotImplemented
    return _correct(Z / s, *cap)


def base_logdet(op):
    """The determinant lemma around an operator with its own closed-form solve and log-determinant."""
    parts = _base_split(op)
    if parts is None:
        return NotImplemented
    B, s, lowrank = parts
    log_det_B, cap = closed_forms.logdet(B), _base_capacitance(B, s, lowrank)
    if log_det_B is NotImplemented or cap is None:
        return NotImplemented
    return op.shape[0] * jnp.log(jnp.abs(s)) + log_det_B + jnp.linalg.slogdet(cap[3])[1]


def _orthonormal_shift(parts):
    r"""``(c, U, d)`` when the sum is $cI + U \operatorname{diag}(d) U^\top$ with orthonormal $U$, else None."""
    D, lowrank, scalar_D = parts
    if not scalar_D or len(lowrank) != 1:
        return None
    U, d, _, leaf = lowrank[0]
    return (D, U, d) if leaf.symmetric and leaf.orthonormal else None


def inv(op):
    r"""$(cI + U \operatorname{diag}(d) U^\top)^{-1} = I/c + U \operatorname{diag}(1/(c+d) - 1/c) U^\top$.

    For orthonormal $U$; NotImplemented otherwise.
    """
    parts = split(op)
    shifted = None if parts is None else _orthonormal_shift(parts)
    if shifted is None:
        return NotImplemented
    c, U, d = shifted
    psd = _tags.psd in op.tags
    return Sum((Scaled(1.0 / c, Identity(op.shape[0], op.dtype), nonnegative=psd or None),
                LowRank(U, 1.0 / (c + d) - 1.0 / c, orthonormal=True)))


def logdet(op):
    parts = split(op)
    if parts is None:
        return NotImplemented
    D, lowrank, scalar_D = parts
    n = op.shape[0]
    log_det_D = n * jnp.log(jnp.abs(D)) if scalar_D else jnp.sum(jnp.log(jnp.abs(D)))
    if not lowrank:
        return log_det_D
    if (shifted := _orthonormal_shift(parts)) is not None:  # eigenvalues c + d on span U, c elsewhere
        c, U, d = shifted
        return jnp.sum(jnp.log(jnp.abs(c + d))) + (n - U.shape[1]) * jnp.log(jnp.abs(c))
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


def root(op):
    r"""A root $R$ with $R R^\top = D + \sum_j U_j \operatorname{diag}(d_j) U_j^\top$ for a PSD sum.

    The principal square root where `sqrt` has one; otherwise the rectangular
    $R = [D^{1/2}, U_1 \operatorname{diag}(d_1)^{1/2}, \dots]$ of shape ``(n, n + k)``, applied as
    a sum of restrictions (nothing ``n x n`` is formed). ``A^{-1} R`` is then a root of $A^{-1}$.
    """
    principal = sqrt(op)
    if principal is not NotImplemented:
        return principal
    parts = split(op)
    if parts is None or _tags.psd not in op.tags:  # psd sum: every term is psd, so each d_j >= 0
        return NotImplemented
    D, lowrank, _ = parts
    if any(not leaf.symmetric for *_, leaf in lowrank):
        return NotImplemented
    n = op.shape[0]
    width = n + sum(u.shape[1] for u, *_ in lowrank)
    pieces = [Product((Diagonal(jnp.sqrt(jnp.broadcast_to(D, (n,))), nonnegative=True),
                       Selection(jnp.arange(n), width)))]
    start = n
    for U, d, _, _ in lowrank:
        k = U.shape[1]
        pieces.append(Product((Dense(U * jnp.sqrt(d)[None, :]), Selection(jnp.arange(start, start + k), width))))
        start += k
    return Sum(pieces)


# A sum's closed forms (tried in this order: the diagonal-plus-low-rank form first, then one other operator
# plus low rank).
for _function, _rule in ((closed_forms.solve, solve), (closed_forms.logdet, logdet), (closed_forms.inv, inv),
                         (closed_forms.sqrt, sqrt), (closed_forms.root, root), (closed_forms.solve, base_solve),
                         (closed_forms.logdet, base_logdet)):
    _function.register(Sum, _rule)
