"""`linops.Circulant`: every closed form against the dense circulant matrix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import linops as lo
from linops.testing import assert_operator_matches
from linops.testing import strategies as lst

from ._util import assert_close

RNG = np.random.default_rng(3)


def _dense(c):
    n = len(c)
    return c[(np.arange(n)[:, None] - np.arange(n)[None, :]) % n]


def _spd_column(n):
    w = RNG.uniform(0.3, 2.0, n)
    return np.fft.ifft((w + w[(-np.arange(n)) % n]) / 2).real


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_a_general_circulant_matches_its_dense_matrix(n):
    c = RNG.standard_normal(n)
    C, M = lo.Circulant(jnp.asarray(c)), _dense(c)
    assert_operator_matches(C, M)
    assert_operator_matches(C.T, M.T)
    b = RNG.standard_normal((n, 3))
    assert_close(lo.diag(C), np.diag(M))
    assert_close(lo.trace(C), np.trace(M))
    assert_close(lo.solve(C, b).value, np.linalg.solve(M, b))
    assert_close(lo.solve(C, b[:, 0]).value, np.linalg.solve(M, b[:, 0]))
    assert_close(lo.inv(C).as_matrix(), np.linalg.inv(M))
    assert isinstance(lo.closed_forms.inv(C), lo.Circulant)
    assert_close(lo.logdet(C), np.linalg.slogdet(M)[1])
    assert_close(lo.shift(C, 0.7).as_matrix(), M + 0.7 * np.eye(n))
    assert isinstance(lo.shift(C, 0.7), lo.Circulant)
    assert_close(lo.closed_forms.hadamard_square(C).as_matrix(), M * M)
    with pytest.raises(ValueError, match="symmetric"):  # no tag, no symmetric eigenvalues
        lo.eigvalsh(C)


@pytest.mark.parametrize("n", [1, 4, 7])
def test_a_psd_circulant_has_its_square_root_and_eigenvalues(n):
    c = _spd_column(n)
    C, M = lo.Circulant(jnp.asarray(c), tags={"psd"}), _dense(c)
    assert_operator_matches(C, M)  # the declared psd tag holds
    assert C.T is C
    S = lo.sqrt(C)
    assert_close(S.as_matrix() @ S.as_matrix(), M)
    assert_close(lo.eigvalsh(C), np.linalg.eigvalsh(M))
    assert "psd" in lo.shift(C, 0.5, nonnegative=True).tags
    assert "psd" not in lo.shift(C, -0.5).tags
    assert "psd" in lo.closed_forms.hadamard_square(C).tags  # Schur product theorem
    x = RNG.standard_normal(n)
    assert_close(jax.jit(lambda C, x: lo.solve(C, x).value)(C, jnp.asarray(x)), np.linalg.solve(M, x))


@settings(max_examples=15, deadline=None)
@given(lst.operators(kinds=("circulant", "circulant_psd")))
def test_the_drawn_circulants_match_their_references(case):
    assert_operator_matches(case.op, case.dense)
    assert_close(lo.logdet(case.op), np.linalg.slogdet(case.dense)[1], rtol=1e-6)


def test_a_circulant_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="Circulant"):
        lo.Circulant(jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="unknown tag"):
        lo.Circulant(jnp.ones(3), tags={"positive"})
