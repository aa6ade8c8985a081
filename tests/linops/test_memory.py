"""Memory pre-flight: requests that cannot fit are refused before any work, with the size and the way out."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import linops as lo
from linops.likelihoods import Categorical
from linops.memory import MemoryBudgetError, check_fits, dense_bytes, format_bytes, program_bytes
from linops.models import from_equinox
from tests import _draws as draws


def test_dense_requests_that_cannot_fit_are_refused_before_any_work():
    calls = []
    huge = lo.FunctionOp(lambda v: calls.append(1) or v, (10**6, 10**6), jnp.float32)
    assert dense_bytes(huge) == 4 * 10**12
    with pytest.raises(MemoryBudgetError, match=r"FunctionOp\(1000000, 1000000\)\.as_matrix\(\) needs 4\.0 TB"):
        huge.as_matrix()
    with pytest.raises(MemoryBudgetError, match=r"apply the operator to vectors"):
        lo.Diagonal(jnp.ones(10**6)).as_matrix()
    assert calls == []  # refused before a single product
    small = lo.Dense(jnp.eye(3))
    lo.memory.check_dense(small)  # fits: no error
    with pytest.raises(MemoryBudgetError, match=r"needs 72 B but only 10 B are available"):
        lo.memory.check_dense(small, limit=10)



def test_a_wide_operator_as_matrix_allocates_nothing_larger_than_its_matrix():
    """A 10 x 118k Jacobian's matrix is 9 MB; reading it through 118k columns of an identity allocated 56 GB."""
    m, n = 4, 50_000
    W = draws.normal(jax.random.key(0), (m, n), jnp.float32)
    J = lo.FunctionOp(lambda v: W @ v, (m, n), jnp.float32)  # its transpose comes from a VJP
    jaxpr = jax.make_jaxpr(J.as_matrix)()
    sizes = [v.aval.size for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars]
    assert max(sizes) <= m * n  # was n * n (the identity)
    assert jnp.allclose(J.as_matrix(), W)
    tall = lo.FunctionOp(lambda v: W.T @ v, (n, m), jnp.float32)  # tall: the n x m identity's columns, as before
    assert jnp.allclose(tall.as_matrix(), W.T)


def test_check_fits_and_format_bytes():
    check_fits(10, "x", "y", limit=10)
    with pytest.raises(MemoryBudgetError, match="thing needs 2.5 GB but only 1.0 GB are available; do less"):
        check_fits(2_500_000_000, "thing", "do less", limit=10**9)
    assert format_bytes(999) == "999 B" and format_bytes(1500) == "1.5 kB"
    assert lo.memory.available_bytes() is None or lo.memory.available_bytes() > 0


def test_program_bytes_of_a_ggn_product_grow_with_the_batch_not_the_data():
    model = eqx.nn.MLP(20, 5, 32, 1, activation=jnp.tanh, key=jax.random.key(0))
    fn, params = from_equinox(model)
    X = draws.normal(jax.random.key(1), (256, 20))
    y = jax.random.randint(jax.random.key(2), (256,), 0, 5)
    small = program_bytes(lo.GGNOp(fn, params, X, y, Categorical(), batch_size=8))
    large = program_bytes(lo.GGNOp(fn, params, X, y, Categorical(), batch_size=256))
    P = lo.GGNOp(fn, params, X, y, Categorical()).shape[0]
    data = X.nbytes + y.nbytes
    assert small >= data + P * X.dtype.itemsize
    assert large > small  # activations of 256 examples at once against 8
    assert program_bytes(lo.Dense(jnp.eye(4)), num_vectors=3) >= (16 + 12 + 12) * jnp.eye(1).dtype.itemsize


def test_kfac_factors_that_cannot_fit_are_refused_before_any_pass(monkeypatch):
    """A dense layer on 60,000 inputs: its input factor alone is 60,000² floats (14 GB in float32)."""
    calls = []

    def fn(p, x):
        calls.append(1)  # traced once to find the layers; a pass over the data would trace the batch function
        return p["W"] @ x

    params = {"W": jnp.zeros((2, 60_000), jnp.float32)}
    X, Y = jnp.zeros((3, 60_000), jnp.float32), jnp.zeros((3,), jnp.int32)
    monkeypatch.setattr(lo.memory, "available_bytes", lambda device=None: 10 * 2**30)
    with pytest.raises(MemoryBudgetError, match=r"kfac: the Kronecker factors of 1 layers \(the widest with 60000 "
                                                r"inputs\) needs 28\.8 GB but only 10\.7 GB"):
        lo.kfac(fn, params, X, Y, Categorical())
    traced = len(calls)
    small = {"W": jnp.zeros((2, 30), jnp.float32)}
    lo.kfac(fn, small, X[:, :30], Y, Categorical())
    assert traced <= 2 and len(calls) > traced


def test_a_dense_solve_counts_the_matrix_and_its_lu_factors(monkeypatch):
    """as_matrix alone needs n² numbers; LU holds a factored copy too: 2n² (the check counted n²)."""
    A = lo.FunctionOp(lambda v: 2.0 * v, (1000, 1000), jnp.float32)
    monkeypatch.setattr(lo.memory, "available_bytes", lambda device=None: 6 * 10**6)  # 1.5 n² float32: n² fits
    lo.memory.check_dense(A)
    with pytest.raises(MemoryBudgetError, match=r"solve\(method='dense'\) of FunctionOp\(1000, 1000\) \(the matrix "
                                                 r"and its LU factors\) needs 8\.0 MB"):
        lo.solve(A, jnp.ones(1000), method="dense")


def test_the_ggn_diagonal_with_the_default_batch_size_holds_a_bounded_number_of_rows():
    """Issue 19: with the default batch size the diagonal held every example's rows at once, N x O x P
    numbers (8.7 GB at N = 6,000 and P = 118k). Now at most about 2^25 numbers of rows per step: the
    compiled program's temporaries (XLA's analysis, no run) stay far below N x O x P."""
    fn, params = from_equinox(eqx.nn.MLP(784, 10, 128, 2, activation=jnp.tanh, key=jax.random.key(0)))
    fn32 = lambda p, x: fn(p, x)  # noqa: E731
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    X = jnp.zeros((6000, 784), jnp.float32)
    y = jnp.zeros((6000,), jnp.int32)
    G = lo.GGNOp(fn32, params, X, y, Categorical())
    P = G.shape[0]
    compiled = jax.jit(lo.diag).lower(G).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    all_rows = 6000 * 10 * P * 4
    assert all_rows > 2.5e10 and temp < 4 * 2**25 * 4 + 64 * 2**20, (temp, all_rows)
