"""The rewrite-rule registry and `simplify`, a fixed-point rewrite pass.

A rule is a subclass of `Rule` whose ``apply`` returns a new operator or raises
`NoReduction`. Subclassing registers it (pass ``register=False`` to opt out). Every rule
must shrink the expression (fewer nodes or fewer matrix products), which is what makes
the pass terminate; rules never densify.
"""

from __future__ import annotations

from linops.algebra import _tags
from linops.algebra._base import LinearOperator
from linops.algebra._composite import Scaled, Sum, constant_product
from linops.algebra._leaves import Diagonal, Identity, Zero
from linops.algebra._products import Inverse, Product, Transpose
from linops.algebra._projector import Complement, ProjectorOp
from linops.algebra._structured import Selection


class NoReduction(Exception):
    """Raised by a rule that does not apply."""


RULES: list[Rule] = []
"""The registered rules, in the order `simplify` tries them (subclassing `Rule` appends)."""


class Rule:
    """Base class of rewrite rules; subclasses are registered on definition.

    Examples:
        >>> import linops as lo
        >>> class DropDoubleNegation(lo.Rule, register=False):
        ...     def apply(self, op):
        ...         raise lo.NoReduction
    """

    def __init_subclass__(cls, register: bool = True, **kw):
        super().__init_subclass__(**kw)
        if register:
            RULES.append(cls())

    def apply(self, op: LinearOperator) -> LinearOperator:
        raise NoReduction

    def __repr__(self):
        return type(self).__name__


def simplify(op: LinearOperator, rules: list[Rule] | None = None) -> LinearOperator:
    """Rewrite ``op`` with the registered rules until none applies.

    Sound (the result is the same linear map), idempotent, and it never adds matrix
    products. Leaves are matched by their signatures (structure and arrays), and a composite records
    which of its leaves share arrays, so rules also fire on expressions that went through `jax.jit`.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> P = lo.ProjectorOp.onto_null_space(jnp.ones((1, 3)))
        >>> lo.simplify(P.T @ P @ P)
        ProjectorOp(...)
    """
    rules = RULES if rules is None else rules

    def rewrite(node: LinearOperator) -> LinearOperator:
        while True:  # a loop, not a recursive call per rewrite: a rule may fire 10,000 times on one node
            children = node.children()
            if children:
                new = tuple(rewrite(c) for c in children)
                if any(a is not b for a, b in zip(new, children, strict=True)):
                    node = node.with_children(new)
            for rule in rules:
                try:
                    node = rule.apply(node)
                except NoReduction:
                    continue
                break
            else:
                return node

    return rewrite(op)


# --- helpers -------------------------------------------------------------------------


def _product(factors, shape, dtype):
    if not factors:
        return Identity(shape[0], dtype)
    return factors[0] if len(factors) == 1 else Product(factors)


def _rewrite_pairs(op, pair_rule):
    """Apply ``pair_rule(left, right) -> list | None`` (a list of at most one operator) to every matching
    adjacent pair, in one left-to-right pass: a product of 10,000 diagonals is merged in one pass, not
    10,000 passes of the rule."""
    if not isinstance(op, Product):
        raise NoReduction
    out, changed = [], False
    for f in op.factors:
        out.append(f)
        while len(out) >= 2 and (merged := pair_rule(out[-2], out[-1])) is not None:
            assert len(merged) <= 1, "a pair rule must shrink the product"
            out[-2:] = merged
            changed = True
    if not changed:
        raise NoReduction
    return _product(out, op.shape, op.dtype)


# --- transposes ----------------------------------------------------------------------


class PushTranspose(Rule):
    """``(A^T)^T -> A``, ``(AB)^T -> B^T A^T``, ``(cA)^T -> c A^T``, ``S^T -> S`` for symmetric ``S``."""

    def apply(self, op):
        if not isinstance(op, Transpose):
            raise NoReduction
        pushed = op.op.transpose()
        if isinstance(pushed, Transpose):
            raise NoReduction
        return pushed


# --- flattening, scalars, identities, zeros --------------------------------------------


class FlattenSum(Rule):
    def apply(self, op):
        if not isinstance(op, Sum) or not any(isinstance(t, Sum) for t in op.terms):
            raise NoReduction
        return Sum([s for t in op.terms for s in (t.terms if isinstance(t, Sum) else (t,))])


class FlattenProduct(Rule):
    def apply(self, op):
        if not isinstance(op, Product) or not any(isinstance(f, Product) for f in op.factors):
            raise NoReduction
        return Product([g for f in op.factors for g in (f.factors if isinstance(f, Product) else (f,))])


class DropZeroTerms(Rule):
    """``A + 0 -> A``."""

    def apply(self, op):
        if not isinstance(op, Sum) or not any(_tags.zero in t.tags for t in op.terms):
            raise NoReduction
        kept = [t for t in op.terms if _tags.zero not in t.tags]
        if not kept:
            return Zero(*op.shape, dtype=op.dtype)
        return kept[0] if len(kept) == 1 else Sum(kept)


class ZeroProduct(Rule):
    """``0 @ A -> 0``, ``A @ 0 -> 0``, ``c 0 -> 0``."""

    def apply(self, op):
        if isinstance(op, Product) and any(_tags.zero in f.tags for f in op.factors):
            return Zero(*op.shape, dtype=op.dtype)
        if isinstance(op, Scaled) and _tags.zero in op.op.tags:
            return Zero(*op.shape, dtype=op.dtype)
        raise NoReduction


class DropIdentity(Rule):
    """``I @ A -> A`` and ``A @ I -> A``."""

    def apply(self, op):
        # By tag, so Kronecker(I, I) or a user's identity-tagged operator is dropped too.
        if not isinstance(op, Product) or not any(_tags.identity in f.tags for f in op.factors):
            raise NoReduction
        kept = [f for f in op.factors if _tags.identity not in f.tags]
        return _product(kept, op.shape, op.dtype)


class FoldScalars(Rule):
    """``c (d A) -> (cd) A``, ``A (c B) -> c (A B)``, ``1 A -> A``."""

    def apply(self, op):
        if isinstance(op, Scaled):
            if op.is_one:
                return op.op
            if isinstance(op.op, Scaled):
                inner = op.op
                return Scaled(op.scalar * inner.scalar, inner.op,
                              nonnegative=(op.nonnegative and inner.nonnegative) or None,
                              constant=constant_product(op.constant, inner.constant))
            raise NoReduction
        if isinstance(op, Product) and any(isinstance(f, Scaled) for f in op.factors):
            scalars = [f for f in op.factors if isinstance(f, Scaled)]
            bare = [f.op if isinstance(f, Scaled) else f for f in op.factors]
            c = scalars[0].scalar
            for s in scalars[1:]:
                c = c * s.scalar
            constant = scalars[0].constant
            for s in scalars[1:]:
                constant = constant_product(constant, s.constant)
            nonneg = all(s.nonnegative for s in scalars) or None
            return Scaled(c, Product(bare), nonnegative=nonneg, constant=constant)
        raise NoReduction


# --- structure-specific ----------------------------------------------------------------


def _same(a, b):
    return a.signature() == b.signature()


class ProjectorIdempotent(Rule):
    """``P @ P -> P`` for an orthogonal projector."""

    def apply(self, op):
        return _rewrite_pairs(op, lambda a, b: [a] if _tags.projector in a.tags and _same(a, b) else None)


def _complementary(a, b):
    if isinstance(a, ProjectorOp) and isinstance(b, ProjectorOp):
        return a.onto != b.onto and a.complement().signature() == b.signature()
    if isinstance(a, Complement) and _same(a.op, b):
        return True
    return isinstance(b, Complement) and _same(b.op, a)


class ComplementaryProjectors(Rule):
    """``(I - P) @ P -> 0`` and ``P @ (I - P) -> 0``."""

    def apply(self, op):
        if not isinstance(op, Product):
            raise NoReduction
        for a, b in zip(op.factors[:-1], op.factors[1:], strict=True):
            if _complementary(a, b):
                return Zero(*op.shape, dtype=op.dtype)
        raise NoReduction


class IdentityMinusProjector(Rule):
    """``I - P -> Complement(P)`` (itself a projector); ``I - (I - P) -> P``."""

    def apply(self, op):
        if isinstance(op, Complement):
            if isinstance(op.op, Complement):
                return op.op.op
            if isinstance(op.op, ProjectorOp):
                return op.op.complement()
            raise NoReduction
        if not isinstance(op, Sum) or len(op.terms) != 2:
            raise NoReduction
        for eye, neg in (op.terms, op.terms[::-1]):
            if (isinstance(eye, Identity) and isinstance(neg, Scaled)
                    and neg.constant == -1.0 and _tags.projector in neg.op.tags):
                return Complement(neg.op)
        raise NoReduction


class RestrictAfterEmbed(Rule):
    """``S @ S^T -> I`` for a `Selection` ``S`` (restriction after embedding)."""

    def apply(self, op):
        def pair(a, b):
            if isinstance(a, Selection) and isinstance(b, Transpose) and isinstance(b.op, Selection):
                if _same(a, b.op):
                    return [Identity(a.shape[0], a.dtype)]
            return None

        return _rewrite_pairs(op, pair)


class DiagonalProduct(Rule):
    """``diag(a) @ diag(b) -> diag(a * b)``."""

    def apply(self, op):
        def pair(a, b):
            if isinstance(a, Diagonal) and isinstance(b, Diagonal):
                return [Diagonal(a.d * b.d, nonnegative=(a.nonnegative and b.nonnegative) or None)]
            return None

        return _rewrite_pairs(op, pair)


class InverseCancels(Rule):
    """``inv(A) @ A -> I``, ``A @ inv(A) -> I``, ``inv(inv(A)) -> A``."""

    def apply(self, op):
        if isinstance(op, Inverse) and isinstance(op.op, Inverse):
            return op.op.op

        def pair(a, b):
            if (isinstance(a, Inverse) and _same(a.op, b)) or (isinstance(b, Inverse) and _same(b.op, a)):
                return [Identity(a.shape[0], op.dtype)]
            return None

        return _rewrite_pairs(op, pair)
