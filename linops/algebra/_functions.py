"""Functions on operators: solve, inv, pinv, sqrt, diag, trace, logdet, eigh (hutchinson: `_estimates`).

Each dispatches to the operator's closed form. Where none exists the call raises and
names the explicit alternatives (``method="cg"``, ``"exact"``, ``"hutchinson"``,
``"dense"``); nothing is ever densified unless ``method="dense"`` asks for it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Inexact, PRNGKeyArray

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._arrays import describe, is_known_nonnegative
from linops.algebra._base import LinearOperator, check_operator, check_square
from linops.algebra._composite import Scaled, Sum
from linops.algebra._eigen import EigenDecomposed
from linops.algebra._estimates import Estimate, hutchinson, rademacher
from linops.algebra._leaves import Dense, Identity, check_vector
from linops.algebra._products import inverse_of
from linops.algebra._solvers import Solution, closed_form, solve_checked
from linops.algebra._structured import Selection


def _check_symmetric(A, what):
    if _tags.symmetric not in A.tags:
        raise ValueError(f"{what}: {describe(A)} is not tagged symmetric (its tags: {sorted(A.tags)})")


def _check_method(what, method, allowed):
    if method not in allowed:
        raise ValueError(f"{what}: unknown method {method!r}; expected one of {allowed}")


def solve(
    A: LinearOperator,
    b: Inexact[ArrayLike, " n *k"],
    *,
    method: str | None = None,
    rtol: float | None = None,
    atol: float = 0.0,
    maxiter: int | None = None,
    preconditioner: LinearOperator | None = None,
    x0: Inexact[ArrayLike, " n *k"] | None = None,
) -> Solution:
    r"""Solve $A x = b$ for ``b`` of shape ``(n,)`` or ``(n, k)``.

    Args:
        A: a square operator.
        b: the right-hand side.
        method: ``None`` uses the closed form of ``A``'s structure (diagonal, Kronecker,
            block diagonal, diagonal/identity + low rank by Woodbury, products of those,
            dense by LU or Cholesky); ``"cg"`` runs conjugate gradients (``A`` must be
            tagged ``psd``); ``"dense"`` materialises ``A`` (``n`` products) and uses LU.
        rtol: CG's relative tolerance: it stops at ``||r|| <= max(rtol ||b||, atol)``;
            default ``sqrt(eps)`` of the dtype.
        atol: CG's absolute tolerance (default 0).
        maxiter: CG iteration cap (default ``10 n``).
        preconditioner: an operator approximating ``A^{-1}`` (for example
            ``lo.inv(lo.Diagonal(lo.diag(A)))``).
        x0: CG starting point.

    Returns:
        A `Solution` with the value and the convergence information.

    Raises:
        ValueError: ``A`` is not square, ``b`` has the wrong shape, or ``A`` has no
            closed form and no method was chosen.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([2.0, 4.0]))
        >>> lo.solve(A, jnp.array([2.0, 2.0])).value
        Array([1. , 0.5], dtype=float32)
    """
    check_operator(A, "solve")
    check_square(A, "solve")
    _check_method("solve", method, (None, "cg", "dense"))
    b = check_vector(A, b, "solve", A.shape[0])
    return solve_checked(A, b, method, rtol=rtol, atol=atol, maxiter=maxiter, preconditioner=preconditioner, x0=x0)


def shift(A: LinearOperator, lam, *, nonnegative: bool | None = None) -> LinearOperator:
    r"""$A + \lambda I$, with the sign of $\lambda$ declared so PSD-ness is kept under tracing.

    A traced $\lambda$ has no sign to inspect, so ``shift(G, lam, nonnegative=True)`` is how
    a PSD curvature plus a prior precision stays tagged PSD inside `jax.jit`. Shifting a shift adds
    the shifts: ``shift(shift(G, a), b)`` is ``G + (a + b) I``, one term however often it is shifted.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> G = lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"psd"})
        >>> "psd" in lo.shift(G, 0.5).tags
        True
    """
    if not A.is_square:
        raise ValueError(f"shift: expected a square operator, got {describe(A)}")
    structured = closed_forms.shift(A, lam, is_known_nonnegative(lam, nonnegative))
    if structured is not NotImplemented:  # e.g. an eigen-decomposed operator: its eigenvalues move
        return structured
    if isinstance(A, Sum) and _is_shift(A.terms[-1]):  # (B + mu I) + lam I is B + (mu + lam) I: never nests
        mu = A.terms[-1]
        both = (mu.nonnegative and is_known_nonnegative(lam, nonnegative)) or None
        constant = mu.constant + float(lam) if mu.constant is not None and _is_constant_scalar(lam) else None
        return Sum(A.terms[:-1] + (Scaled(mu.scalar + lam, mu.op, nonnegative=both, constant=constant),))
    return Sum((A, Scaled(lam, Identity(A.shape[0], A.dtype), nonnegative=nonnegative)))


def _is_shift(op):
    return type(op) is Scaled and type(op.op) is Identity


def _is_constant_scalar(x):
    return isinstance(x, (int, float, np.number))


def inv(A: LinearOperator, *, method: str | None = None, **options) -> LinearOperator:
    r"""The inverse $A^{-1}$ as an operator: each product is a solve.

    With ``method=None``, a factorisation that the structure has (Cholesky or LU of a dense
    matrix, and those of the factors of a Kronecker product, a block-diagonal operator, a product)
    is computed here, once (`linops.factorize`); every product then reuses it, so
    ``Ai = lo.inv(A); Ai @ (Ai @ v)`` factorises ``A`` once. Structures whose solve is already
    cheap (diagonal, Woodbury, eigen-decomposed) and ``method="cg"``/``"dense"`` (with ``options``
    passed to `linops.solve` at each product) compute nothing until applied. An operator with
    neither a factorisation nor a closed-form solve is refused here, when the inverse is built (choose
    ``method="cg"`` or ``"dense"``), not at its first product.
    `linops.simplify` rewrites ``inv(A) @ A`` to the identity.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Diagonal(jnp.array([2.0, 4.0]))
        >>> lo.inv(A) @ jnp.ones(2)
        Array([0.5 , 0.25], dtype=float32)
        >>> Ai = lo.inv(lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"psd"}))  # Cholesky, here
        >>> type(Ai.factored).__name__, (Ai @ (Ai @ jnp.ones(2))).round(4)         # and not again
        ('Cholesky', Array([0.1111, 0.1111], dtype=float32))
    """
    check_operator(A, "inv")
    check_square(A, "inv")
    _check_method("inv", method, (None, "cg", "dense"))
    if method == "cg" and _tags.psd not in A.tags:
        raise ValueError(f"inv(method='cg'): {describe(A)} is not tagged psd")
    out = inverse_of(A, method, tuple(sorted(options.items())))
    if method is None and getattr(out, "factored", True) is None and not _solves_in_closed_form(A):
        raise ValueError(f"inv: {describe(A)} has no closed-form solve here; choose a method explicitly: method='cg' "
                         "(A tagged psd) or method='dense'")
    return out


_CLOSED_SOLVE: dict = {}  # (structure, shapes, dtypes) -> whether the solve has a closed form (a memo, not a setting)


def _solves_in_closed_form(A: LinearOperator) -> bool:
    """Whether ``A``'s solve has a closed form: its hook traced on an abstract vector, so nothing is computed; once
    per structure (types, static options, shapes and dtypes decide it, as they decide a compiled program)."""
    leaves, treedef = jax.tree_util.tree_flatten(A)
    key = (treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
    if key not in _CLOSED_SOLVE:
        if len(_CLOSED_SOLVE) >= 1024:
            _CLOSED_SOLVE.clear()
        _CLOSED_SOLVE[key] = _probe_solve(A)
    return _CLOSED_SOLVE[key]


def _probe_solve(A: LinearOperator) -> bool:
    found = [True]

    def probe(b):
        x = closed_forms.solve(A, b)
        if x is NotImplemented:
            found[0] = False
            return b
        return x

    jax.eval_shape(probe, jax.ShapeDtypeStruct((A.shape[1],), A.dtype))
    return found[0]


def factorize(A: LinearOperator) -> LinearOperator:
    r"""``A`` held as its factorisation, computed now, once: solves, log-determinants and roots reuse it.

    A PSD dense matrix becomes a `linops.Cholesky`, another dense one a `linops.LU`; a Kronecker
    product, block-diagonal operator, scaling, transpose or product of square operators is
    factorised factor by factor. An operator with nothing to factorise (diagonal, eigen-decomposed,
    low rank plus diagonal, ...) is returned as it is.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[4.0, 2.0], [2.0, 2.0]]), tags={"psd"})
        >>> K = lo.factorize(lo.Kronecker(A, lo.Identity(2)))
        >>> type(K.A).__name__, lo.logdet(K)     # 2 log det A = 2 log 4
        ('Cholesky', Array(2.7725887, dtype=float32))
    """
    check_operator(A, "factorize")
    check_square(A, "factorize")
    f = closed_forms.factorize(A)
    return A if f is NotImplemented else f


def root(A: LinearOperator) -> LinearOperator:
    r"""A square-root factor $R$ (shape ``(n, r)``) with $R R^\top = A$, for a PSD ``A``: use it to sample.

    If $z \sim \mathcal N(0, I_r)$ then $R z \sim \mathcal N(0, A)$. The principal square root
    (`linops.sqrt`) where the structure has one; a triangular Cholesky factor for a dense or
    `linops.Cholesky` operator; $L^{-\top}$ for its inverse (one triangular solve per sample); the
    rectangular $[D^{1/2}, U \operatorname{diag}(d)^{1/2}]$ for diagonal plus low rank (and
    $A^{-1} R$ for its inverse); factor by factor for Kronecker, block-diagonal and scaled operators.

    Examples:
        >>> import jax, jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[4.0, 2.0], [2.0, 2.0]]), tags={"psd"})
        >>> R = lo.root(lo.inv(A))                       # L^-T: R R^T = A^-1
        >>> jnp.allclose((R @ R.T).as_matrix(), jnp.linalg.inv(A.matrix))
        Array(True, dtype=bool)
        >>> samples = R @ jax.random.normal(jax.random.key(0), (R.shape[1], 1000))   # ~ N(0, A^-1)
    """
    check_operator(A, "root")
    check_square(A, "root")
    if _tags.psd not in A.tags:
        raise ValueError(f"root: {describe(A)} is not tagged psd (its tags: {sorted(A.tags)}); a square-root factor "
                         "exists for PSD operators only")
    return closed_form(closed_forms.root(A), A, "root", "lo.sqrt(A, method='dense')")


def eigendecompose(A: LinearOperator) -> LinearOperator:
    r"""A symmetric ``A`` as a `linops.EigenDecomposed` $Q \operatorname{diag}(w) Q^\top$ (eigenvalues unsorted).

    Structured where ``A`` is (a Kronecker product of eigen-decomposed factors; a diagonal with
    $Q = I$); a dense matrix by `jax.numpy.linalg.eigh`. Afterwards shifts, inverses, roots and
    log-determinants cost $O(n)$ on the eigenvalues.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"psd"})
        >>> E = lo.eigendecompose(lo.Kronecker(A, A))
        >>> E.w, type(E.Q).__name__
        (Array([1., 3., 3., 9.], dtype=float32), 'Kronecker')
    """
    check_operator(A, "eigendecompose")
    check_square(A, "eigendecompose")
    _check_symmetric(A, "eigendecompose")
    E = closed_forms.eigendecompose(A)
    if E is NotImplemented:
        wq = closed_form(closed_forms.eigh(A), A, "eigendecompose", "lo.Dense(A.as_matrix(), tags={'symmetric'})")
        E = EigenDecomposed(wq[1], wq[0], nonnegative=True if _tags.psd in A.tags else None)
    return E


def eigvalsh(A: LinearOperator, *, method: str | None = None) -> Float[Array, " n"]:
    r"""The eigenvalues of a symmetric ``A`` in ascending order (no eigenvectors are formed where avoidable).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.eigvalsh(lo.Dense(jnp.array([[2.0, 1.0], [1.0, 2.0]]), tags={"symmetric"}))
        Array([1., 3.], dtype=float32)
    """
    check_operator(A, "eigvalsh")
    check_square(A, "eigvalsh")
    _check_method("eigvalsh", method, (None, "dense"))
    _check_symmetric(A, "eigvalsh")
    if method is None:
        return closed_form(closed_forms.eigvalsh(A), A, "eigvalsh", "method='dense'")
    return jnp.linalg.eigvalsh(A.as_matrix())


def pinv(A: LinearOperator, *, rtol: float | None = None, method: str | None = None) -> LinearOperator:
    r"""The Moore-Penrose pseudo-inverse, with a RELATIVE cut-off.

    Singular values below ``rtol * max singular value`` count as zero
    (default ``rtol = max(m, n) * eps``). A projector is its own pseudo-inverse.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.pinv(lo.Diagonal(jnp.array([2.0, 0.0]))) @ jnp.ones(2)
        Array([0.5, 0. ], dtype=float32)
    """
    check_operator(A, "pinv")
    _check_method("pinv", method, (None, "dense"))
    if method is None:
        return closed_form(closed_forms.pinv(A, rtol), A, "pinv", "method='dense'")
    return closed_forms.pinv(Dense(A.as_matrix(), tags=A.tags & {_tags.symmetric}), rtol)


def sqrt(A: LinearOperator, *, method: str | None = None) -> LinearOperator:
    r"""The principal square root $S = S^\top \succeq 0$ with $S S = A$, for a PSD ``A``.

    Use it to sample: if $\varepsilon \sim \mathcal N(0, I)$ then $S\varepsilon \sim \mathcal N(0, A)$.
    A projector is its own square root.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.sqrt(4.0 * lo.Identity(2)) @ jnp.ones(2)
        Array([2., 2.], dtype=float32)
    """
    check_operator(A, "sqrt")
    check_square(A, "sqrt")
    _check_method("sqrt", method, (None, "dense"))
    if _tags.psd not in A.tags:
        raise ValueError(
            f"sqrt: {describe(A)} is not tagged psd (its tags: {sorted(A.tags)}); the principal "
            "square root is defined here for PSD operators only"
        )
    if method is None:
        return closed_form(closed_forms.sqrt(A), A, "sqrt",
                           "method='dense'; or, to sample, lo.root(A), a factor R with R R^T = A "
                           "that more structures have (diagonal plus low rank, Cholesky factors)")
    return closed_forms.sqrt(Dense(A.as_matrix(), tags={_tags.psd}))


def _basis_probe(A, fn, chunk):
    """Apply ``fn(A, E)`` to blocks ``E`` of the identity's columns: O(n * chunk) memory."""
    n = A.shape[1]
    chunk = min(chunk, n)
    starts = jnp.arange(0, n, chunk)

    def block(start):
        cols = start + jnp.arange(chunk)
        E = (jnp.arange(n)[:, None] == cols[None, :]).astype(A.dtype)
        return fn(A, E, cols)

    out = jax.lax.map(block, starts)  # (num_blocks, chunk)
    return out.reshape(-1)[:n]


def diag(
    A: LinearOperator,
    *,
    method: str | None = None,
    key: PRNGKeyArray | None = None,
    num_samples: int = 64,
    chunk: int = 32,
) -> Inexact[Array, " n"] | Estimate:
    r"""The diagonal of ``A``.

    Args:
        method: ``None`` for the closed form; ``"exact"`` probes with the ``n`` unit vectors in
            blocks of ``chunk`` (``n`` products, ``O(n * chunk)`` memory); ``"hutchinson"``
            gives the unbiased estimate $\mathbb E[z \odot A z]$ with Rademacher ``z``
            (needs ``key``) as an `Estimate`: the ``(n,)`` values and each one's standard error.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> A = lo.Dense(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> lo.diag(A @ A, method="exact")
        Array([ 7., 22.], dtype=float32)
    """
    check_operator(A, "diag")
    _check_method("diag", method, (None, "exact", "hutchinson"))
    if method is None:
        return closed_form(closed_forms.diag(A), A, "diag",
                           "method='exact' (n products) or method='hutchinson' (with key)")
    check_square(A, f"diag(method={method!r})")
    if method == "exact":
        pick = lambda A, E, cols: jnp.take_along_axis(A.mm(E), jnp.minimum(cols, A.shape[0] - 1)[None, :], 0)[0]  # noqa: E731
        return _basis_probe(A, pick, chunk)
    Z = rademacher(key, A, num_samples, "diag")
    samples = Z * A.mm(Z)  # (n, s): one estimate of every entry per probe
    return Estimate(jnp.mean(samples, axis=1), jnp.std(samples, axis=1, ddof=1) / jnp.sqrt(num_samples),
                    num_samples)


def trace(
    A: LinearOperator,
    *,
    method: str | None = None,
    key: PRNGKeyArray | None = None,
    num_samples: int = 64,
) -> Inexact[Array, ""] | Estimate:
    r"""The trace of a square ``A``.

    ``method=None`` uses the closed form (the rank for a projector); ``"exact"`` sums the exact
    diagonal; ``"hutchinson"`` returns the `Estimate` of `linops.hutchinson` (the value with its
    standard error).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> lo.trace(lo.Kronecker(lo.Identity(2), lo.Diagonal(jnp.array([1.0, 2.0]))))
        Array(6., dtype=float32)
    """
    check_operator(A, "trace")
    check_square(A, "trace")
    _check_method("trace", method, (None, "exact", "hutchinson"))
    if method is None:
        return closed_form(closed_forms.trace(A), A, "trace",
                           "method='exact' (n products) or method='hutchinson' (with key)")
    if method == "exact":
        return jnp.sum(diag(A, method="exact"))
    return hutchinson(A, key, num_samples)


STOCHASTIC_LOGDET: dict = {}
"""``method=`` name -> the estimator `logdet` calls with ``(A, key=..., **options)``: filled by the numerics layer
(``"slq"``, `linops.numerics._slq`), which the algebra does not import."""


def logdet(A: LinearOperator, *, method: str | None = None, key: PRNGKeyArray | None = None,
           **options) -> Float[Array, ""] | Estimate:
    r"""$\log|\det A|$ of a square operator.

    Closed forms: diagonal, Kronecker ($n_B \log|A| + n_A \log|B|$), block diagonal, products of
    square factors, scalings, inverses, and diagonal/identity + low rank (the matrix
    determinant lemma, never forming ``n x n``). ``method="dense"`` materialises ``A``.
    ``method="slq"`` (a PSD operator, with ``key``; options ``num_samples=16``, ``num_steps=30``) estimates it
    from products alone by stochastic Lanczos quadrature and returns an `Estimate` with its standard error,
    differentiable in reverse mode.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> U = jnp.array([[1.0], [1.0]])
        >>> lo.logdet(lo.LowRank(U, jnp.array([1.0])) + lo.Identity(2))   # log 3
        Array(1.0986123, dtype=float32)
        >>> import jax
        >>> est = lo.logdet(lo.Diagonal(jnp.array([1.0, 2.0, 4.0])), method="slq", key=jax.random.key(0), num_steps=3)
        >>> bool(abs(est.value - jnp.log(8.0)) < 1e-4), est.num_samples
        (True, 16)
    """
    check_operator(A, "logdet")
    check_square(A, "logdet")
    _check_method("logdet", method, (None, "dense", *STOCHASTIC_LOGDET))
    if method in STOCHASTIC_LOGDET:
        return STOCHASTIC_LOGDET[method](A, key=key, **options)
    if options or key is not None:
        given = sorted(options) + (["key"] if key is not None else [])
        raise ValueError(f"logdet(method={method!r}) takes no key or options, got {given}")
    if method is None:
        return closed_form(closed_forms.logdet(A), A, "logdet", "method='dense'")
    return closed_forms.logdet(Dense(A.as_matrix(), tags=A.tags & {_tags.psd}))


def eigh(A: LinearOperator, *, method: str | None = None) -> tuple[Float[Array, " n"], LinearOperator]:
    r"""Eigendecomposition $A = Q \operatorname{diag}(w) Q^\top$ of a symmetric operator.

    Returns ``(w, Q)``: eigenvalues in ascending order and the eigenvectors as an
    orthogonal operator (structured where ``A`` is: a permutation for a diagonal, a
    Kronecker product for a Kronecker product).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> w, Q = lo.eigh(lo.Diagonal(jnp.array([3.0, 1.0])))
        >>> w, Q @ jnp.array([1.0, 0.0])
        (Array([1., 3.], dtype=float32), Array([0., 1.], dtype=float32))
    """
    check_operator(A, "eigh")
    check_square(A, "eigh")
    _check_method("eigh", method, (None, "dense"))
    _check_symmetric(A, "eigh")
    if method is None:
        wq = closed_forms.eigh(A)
        if wq is NotImplemented and (E := closed_forms.eigendecompose(A)) is not NotImplemented:
            order = jnp.argsort(E.w)
            wq = E.w[order], E.Q @ Selection(order, E.w.shape[0], is_permutation=True).T
        return closed_form(wq, A, "eigh", "method='dense'")
    return closed_forms.eigh(Dense(A.as_matrix(), tags={_tags.symmetric}))


__all__ = ["shift", "solve", "inv", "pinv", "sqrt", "diag", "trace", "logdet", "eigh", "factorize", "root",
           "eigendecompose", "eigvalsh"]
