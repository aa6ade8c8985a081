"""Structural tags and the ONE table of rules that propagates them.

A tag is a promise about an operator (``linops.testing`` checks promises on random
probes). Tags are interned strings, so ``"psd" in A.tags`` reads naturally and a
tag prints as its name.
"""

from __future__ import annotations

from collections.abc import Iterable


class Tag(str):
    """A structural property of an operator; compares equal to its name."""

    def __repr__(self) -> str:
        return repr(str(self))


symmetric = Tag("symmetric")
psd = Tag("psd")
diagonal = Tag("diagonal")
orthogonal = Tag("orthogonal")
projector = Tag("projector")  # orthogonal projector: symmetric and idempotent
identity = Tag("identity")
zero = Tag("zero")

ALL = frozenset({symmetric, psd, diagonal, orthogonal, projector, identity, zero})

# What each tag implies on a SQUARE operator.
_IMPLIES = {
    psd: {symmetric},
    diagonal: {symmetric},
    projector: {symmetric, psd},
    identity: {diagonal, symmetric, psd, orthogonal, projector},
    zero: {diagonal, symmetric, psd, projector},
    orthogonal: set(),
    symmetric: set(),
}

# Tags that survive the transpose.
_TRANSPOSE_KEEPS = ALL


def close(tags: Iterable[str], shape: tuple[int, int]) -> frozenset[Tag]:
    """Normalise user tags (names or `Tag`s) and add everything they imply."""
    out = set()
    for t in tags:
        if t not in ALL:
            raise ValueError(
                f"unknown tag {t!r}; expected one of {sorted(str(a) for a in ALL)}"
            )
        out.add(Tag(t))
    square = shape[0] == shape[1]
    if not square:
        # Only `zero` makes sense for a rectangular operator.
        return frozenset(t for t in out if t == zero)
    changed = True
    while changed:
        changed = False
        for t in list(out):
            for implied in _IMPLIES[t]:
                if implied not in out:
                    out.add(implied)
                    changed = True
    return frozenset(out)


# --- propagation table -------------------------------------------------------------


def of_transpose(tags: frozenset) -> frozenset:
    return frozenset(tags & _TRANSPOSE_KEEPS)


def of_sum(all_tags: list[frozenset], shape) -> frozenset:
    common = frozenset.intersection(*all_tags)
    out = common & {symmetric, psd, diagonal, zero}
    return close(out, shape)


def of_scaled(tags: frozenset, sign: int | None, is_one: bool, shape) -> frozenset:
    """`sign` is +1 (known or declared non-negative), -1 (known negative) or None."""
    if is_one:
        return tags
    out = tags & {symmetric, diagonal, zero}
    if psd in tags and sign == 1:
        out |= {psd}
    return close(out, shape)


def of_product(
    all_tags: list[frozenset],
    shape,
    *,
    congruence_middle: frozenset | None,
    is_congruence: bool,
    is_idempotent_square: bool,
) -> frozenset:
    """Tags of ``A_1 A_2 ... A_k``.

    ``is_congruence`` says the factors read ``X_1^T ... X_j^T M X_j ... X_1`` (or with no
    middle ``M``); then the product is symmetric when ``M`` is, and PSD when ``M`` is PSD
    (``X^T M X`` PSD: this is why a GGN is PSD).
    """
    out = set()
    if any(zero in t for t in all_tags):
        return close({zero}, shape)
    for tag in (diagonal, orthogonal, identity):
        if all(tag in t for t in all_tags):
            out.add(tag)
    if is_congruence:
        if congruence_middle is None or psd in congruence_middle:
            out |= {symmetric, psd}
        elif symmetric in congruence_middle:
            out.add(symmetric)
    if is_idempotent_square:
        out.add(projector)
    return close(out, shape)


def of_inverse(tags: frozenset, shape) -> frozenset:
    return close(tags & {symmetric, psd, diagonal, orthogonal, identity}, shape)
