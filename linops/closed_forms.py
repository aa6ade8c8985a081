"""The closed forms of the algebra: one dispatch table per function, the one way to extend it.

Every structure-aware function of the algebra (`linops.diag`, `linops.solve`, `linops.logdet`, ...)
first asks its `ClosedForm` here for the operator's closed form. A closed form is a *rule*
registered for an operator class::

    @lo.closed_forms.diag.register(MyOperator)
    def _(op):
        return op.values

A rule returns the value, or ``NotImplemented`` where this instance's structure gives none (a
dense matrix has a Cholesky solve only when tagged PSD). The table is searched along the class's
method resolution order: the rules of the class itself first (in the order registered), then those
of its bases, and the first value that is not ``NotImplemented`` is the answer. The rules registered
for `linops.LinearOperator` itself are the ones the tags give (an orthogonal ``Q`` has
``Q^{-1} = Q^T``; a projector is its own square root), so every operator falls back on them. When
no rule answers, the public function refuses and names its explicit alternatives (``method="cg"``,
``"dense"``, ...); nothing is densified behind the user's back.

`ClosedForm.rules` lists every rule of one function, with where it is defined, so all the closed
forms of ``diag`` (or ``solve``, ...) are readable in one place, wherever their classes live.

The tables (`FUNCTIONS`), with how a rule is called and what it returns:

| table | rule | returns |
|---|---|---|
| ``diag`` | ``rule(op)`` | the main diagonal, shape ``(n,)`` |
| ``solve`` | ``rule(op, b)`` | ``A^{-1} b`` for ``b`` of shape ``(n,)`` or ``(n, k)`` |
| ``inv`` | ``rule(op)`` | a structured operator equal to ``A^{-1}`` |
| ``pinv`` | ``rule(op, rtol)`` | the pseudo-inverse (singular values below ``rtol`` times the largest are zero) |
| ``sqrt`` | ``rule(op)`` | the principal (symmetric PSD) square root, an operator |
| ``logdet`` | ``rule(op)`` | the log of the absolute determinant |
| ``eigh`` | ``rule(op)`` | ``(w, Q)``: eigenvalues ascending, eigenvectors as an orthogonal operator |
| ``trace`` | ``rule(op)`` | the trace |
| ``root`` | ``rule(op)`` | an operator ``R`` of shape ``(n, r)`` with ``R R^T = A`` |
| ``factorize`` | ``rule(op)`` | an operator equal to ``A`` whose solves reuse a factorisation computed once |
| ``eigendecompose`` | ``rule(op)`` | ``A`` as a `linops.EigenDecomposed` (eigenvalues in any order) |
| ``eigvalsh`` | ``rule(op)`` | the eigenvalues, ascending |
| ``svd`` | ``rule(op)`` | ``(U, s, V)``: ``A = U diag(s) V^T``, thin, ``s`` descending |
| ``shift`` | ``rule(op, lam, nonnegative)`` | a structured operator equal to ``A + lam I`` |
| ``hadamard_square`` | ``rule(op)`` | ``A o A`` (every entry squared), where the structure keeps it |
| ``woodbury_part`` | ``rule(op)`` | as a Woodbury term: ``("diagonal", d)``, ``("lowrank", R)``, ``("zero",)`` |

Examples:
    >>> import jax.numpy as jnp, linops as lo
    >>> lo.closed_forms.diag(lo.Diagonal(jnp.array([1.0, 2.0])))
    Array([1., 2.], dtype=float32)
    >>> lo.closed_forms.diag(lo.Dense(jnp.eye(2)) @ lo.Dense(jnp.eye(2)))
    NotImplemented
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

__all__ = [
    "ClosedForm",
    "FUNCTIONS",
    "diag",
    "eigendecompose",
    "eigh",
    "eigvalsh",
    "factorize",
    "hadamard_square",
    "inv",
    "logdet",
    "pinv",
    "root",
    "shift",
    "solve",
    "sqrt",
    "svd",
    "trace",
    "woodbury_part",
]


class ClosedForm:
    """The closed forms of one function of the algebra: a rule per operator class.

    Args:
        name: the function's name (``"diag"``).
        signature: how a rule is called, for the docs (``"rule(op) -> (n,) array"``).
        doc: what the rule returns.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> class Ones(lo.LinearOperator):  # the all-ones matrix 1 1^T
        ...     n: int
        ...     @property
        ...     def shape(self):
        ...         return (self.n, self.n)
        ...     @property
        ...     def dtype(self):
        ...         return jnp.float32
        ...     def mv(self, v):
        ...         return jnp.full(self.n, jnp.sum(v))
        >>> @lo.closed_forms.diag.register(Ones)
        ... def _(op):
        ...     return jnp.ones(op.n)
        >>> lo.trace(Ones(3))  # the trace's tag rule sums the diagonal
        Array(3., dtype=float32)
        >>> [where for cls, where in lo.closed_forms.diag.rules() if cls is Ones]
        ['<doctest ...']
    """

    def __init__(self, name: str, signature: str, doc: str):
        self.name, self.signature = name, signature
        self.__doc__ = f"``{signature}``: {doc}"
        self._rules: dict[type, list[Callable]] = {}
        self._cache: dict[type, tuple[tuple[type, Callable], ...]] = {}

    def register(self, cls: type, rule: Callable | None = None):
        """Register ``rule`` as a closed form of this function for ``cls`` and its subclasses.

        Usable as a decorator (``@lo.closed_forms.solve.register(MyOperator)``) or called with the
        rule. A class may have several rules; they are tried in the order registered. Returns the
        rule, so the decorated function keeps its name.
        """
        if not isinstance(cls, type):
            raise TypeError(f"closed_forms.{self.name}.register: expected an operator class, got {cls!r}")
        if rule is None:
            return functools.partial(self.register, cls)
        if not callable(rule):
            raise TypeError(f"closed_forms.{self.name}.register({cls.__name__}): expected a callable rule, "
                            f"got {rule!r}")
        self._rules.setdefault(cls, []).append(rule)
        self._cache.clear()
        return rule

    def _chain(self, cls: type) -> tuple[tuple[type, Callable], ...]:
        chain = self._cache.get(cls)
        if chain is None:
            chain = tuple((k, rule) for k in cls.__mro__ for rule in self._rules.get(k, ()))
            self._cache[cls] = chain
        return chain

    def __call__(self, op, *args):
        """The closed form of ``op`` (with the function's further arguments), or ``NotImplemented``."""
        for _, rule in self._chain(type(op)):
            out = rule(op, *args)
            if out is not NotImplemented:
                return out
        return NotImplemented

    def after(self, cls: type, op, *args):
        """The closed form the bases of ``cls`` give ``op`` (what ``super()`` gives a method): a rule
        that refines its bases' answer calls this first."""
        mro = type(op).__mro__
        start = mro.index(cls) + 1
        for k in mro[start:]:
            for rule in self._rules.get(k, ()):
                out = rule(op, *args)
                if out is not NotImplemented:
                    return out
        return NotImplemented

    def rules(self) -> list[tuple[type, str]]:
        """Every rule of this function: ``(class, "file:line")``, the classes in registration order."""
        out = []
        for cls, rules in self._rules.items():
            for rule in rules:
                try:
                    where = f"{inspect.getsourcefile(rule)}:{inspect.getsourcelines(rule)[1]}"
                except (OSError, TypeError):
                    where = getattr(rule, "__module__", "?") or "?"
                out.append((cls, where))
        return out

    def __repr__(self):
        return f"ClosedForm({self.name!r})"


diag = ClosedForm("diag", "rule(op) -> (n,) array", "the main diagonal.")
solve = ClosedForm("solve", "rule(op, b) -> array", "``A^{-1} b`` for ``b`` of shape ``(n,)`` or ``(n, k)``.")
inv = ClosedForm("inv", "rule(op) -> LinearOperator", "a structured operator equal to ``A^{-1}``.")
pinv = ClosedForm("pinv", "rule(op, rtol) -> LinearOperator",
                  "the pseudo-inverse, singular values below ``rtol`` times the largest taken as zero.")
sqrt = ClosedForm("sqrt", "rule(op) -> LinearOperator", "the principal (symmetric PSD) square root.")
logdet = ClosedForm("logdet", "rule(op) -> scalar", "``log |det A|``.")
eigh = ClosedForm("eigh", "rule(op) -> (w, Q)",
                  "the eigenvalues, ascending, and the eigenvectors as an orthogonal operator.")
trace = ClosedForm("trace", "rule(op) -> scalar", "the trace.")
root = ClosedForm("root", "rule(op) -> LinearOperator",
                  "an operator ``R`` of shape ``(n, r)`` with ``R R^T = A`` (by default the principal square root).")
factorize = ClosedForm("factorize", "rule(op) -> LinearOperator",
                       "an operator equal to ``A`` whose solves reuse a factorisation computed here, once.")
eigendecompose = ClosedForm("eigendecompose", "rule(op) -> linops.EigenDecomposed",
                            "``A`` as an eigen-decomposition (eigenvalues in any order).")
eigvalsh = ClosedForm("eigvalsh", "rule(op) -> (n,) array", "the eigenvalues in ascending order.")
shift = ClosedForm("shift", "rule(op, lam, nonnegative) -> LinearOperator",
                   "a structured operator equal to ``A + lam I`` (``nonnegative``: the sign of ``lam`` is known).")
svd = ClosedForm("svd", "rule(op) -> (U, s, V)",
                  "the thin singular value decomposition ``A = U diag(s) V^T``: ``U``, ``V`` operators with "
                  "orthonormal columns, ``s`` descending.")
hadamard_square = ClosedForm("hadamard_square", "rule(op) -> LinearOperator",
                             "the operator with every entry squared, ``A o A``, where the structure keeps it.")
woodbury_part = ClosedForm(
    "woodbury_part", "rule(op) -> tuple",
    "what the operator is as a term of a diagonal-plus-low-rank sum: ``('diagonal', d)`` (``d`` a vector or "
    "a scalar), ``('lowrank', leaf)`` (a `linops.AbstractLowRank`) or ``('zero',)``.")

FUNCTIONS: tuple[ClosedForm, ...] = (diag, solve, inv, pinv, sqrt, logdet, eigh, trace, root, factorize,
                                     eigendecompose, eigvalsh, svd, shift, hadamard_square, woodbury_part)
"""Every function's table (a wrapper such as `linops.lower`'s result forwards all of them)."""
