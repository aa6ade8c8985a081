"""Compile once per structure and shape: a second fit and predictive of the same kind, on new weights and data of
the same shapes, compile nothing (XLA's compile events counted through `jax.monitoring`), and their values are
those of the new arrays; a first fit and predictive on a small CNN compile one program each. The per-layer
predictives (diagonal, KFAC) equal the Jacobian-row computation."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
from linops.likelihoods import Categorical
from linops.models import from_equinox, ravel
from linops.testing import count_compilations as compiles
from posteriors.predictive import _row_values
from tests import _draws as draws
from tests.posteriors._shared import axes

from ..linops._util import assert_close
from ..linops.test_layer_diag import CASES


def _mlp_problem(seed):
    fn, params = from_equinox(eqx.nn.MLP(6, 3, 8, 2, activation=jnp.tanh, key=jax.random.key(0)))
    params = jax.tree_util.tree_map(lambda a: a * (1.0 + seed), params)  # new weights, same structure
    X = draws.normal(jax.random.key(seed), (40, 6))
    return fn, params, X, jnp.arange(40) % 3


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "last_layer", "lowrank"])
def test_a_second_fit_and_predictive_of_the_same_kind_compile_nothing(structure):
    kw = {"rank": 4, "key": jax.random.key(1)} if structure == "lowrank" else {}
    fn, params, X, y = _mlp_problem(0)
    first = pst.laplace(fn, params, (X, y), Categorical(), **axes(structure), batch_size=16, **kw)
    p_first = pst.predictive.classification(first, X[:7])
    _, params2, X2, y2 = _mlp_problem(1)
    with compiles() as events:
        second = pst.laplace(fn, params2, (X2, y2), Categorical(), **axes(structure), batch_size=16, **kw)
        p_second = pst.predictive.classification(second, X2[:7])
        jax.block_until_ready((second, p_second))
    assert events == [], f"{len(events)} compilations on the second call"
    # the cached programs computed with the new arrays: the variances differ, and equal the Jacobian rows' form
    _, var = pst.predictive.linearized(second, X2[:7])
    assert not np.allclose(np.asarray(p_first), np.asarray(p_second))
    assert_close(var, _row_values(second, X2[:7], 7, 3, False), rtol=1e-4)


class _Counted(eqx.Module):
    """An MLP that records each Python call of its ``__call__``: each time the library traces the model."""

    mlp: eqx.nn.MLP

    def __call__(self, x):
        _TRACES.append(x.shape)
        return self.mlp(x)


_TRACES: list = []


@pytest.mark.parametrize("structure", ["full", "diag", "kfac", "last_layer", "lowrank"])
def test_a_refit_and_its_predictive_do_not_trace_the_model_again(structure):
    """A refit on new weights and data of the same shapes, and its predictive, call the model's Python code not
    once: nothing is compiled (the test above) and nothing is traced either. Before, every `laplace` call traced
    the model again to find its last layer and to check the restricted model's outputs (the GroupNorm ResNet of
    `benchmarks/lenet_vs_laplace_torch.py`: its steady last-layer fit took 0.32 s then, 0.21 s now)."""
    kw = {"rank": 4, "key": jax.random.key(1)} if structure == "lowrank" else {}
    fn, params = from_equinox(_Counted(eqx.nn.MLP(6, 3, 8, 2, activation=jnp.tanh, key=jax.random.key(0))))
    _, _, X, y = _mlp_problem(0)
    _, _, X2, y2 = _mlp_problem(1)
    params2 = jax.tree_util.tree_map(lambda a: 1.5 * a, params)

    def run(p, X, y):
        post = pst.laplace(fn, p, (X, y), Categorical(), **axes(structure), batch_size=16, progress=False, **kw)
        return post, jax.block_until_ready(pst.predictive.classification(post, X[:7], progress=False))

    first, probs = run(params, X, y)
    assert _TRACES, "the first fit traces the model"
    _TRACES.clear()
    second, probs2 = run(params2, X2, y2)
    assert _TRACES == [], f"the refit traced the model {len(_TRACES)} times"
    assert not np.allclose(np.asarray(probs), np.asarray(probs2))  # the new arrays' values, not cached ones
    _, var = pst.predictive.linearized(second, X2[:7])
    assert_close(var, _row_values(second, X2[:7], 7, 3, False), rtol=1e-4)


@pytest.mark.parametrize("selection", ["subnetwork", "leaves"])
def test_a_second_fit_over_a_selection_of_weights_compiles_nothing(selection):
    """A subnetwork's concrete indices are static data of its fit and predictive programs (one program per index
    set, `posteriors.weights.Weights.fit_form`): a refit on new weights and data of the same shapes compiles
    nothing. Before, its predictive ran eagerly and compiled its small programs on every new shape of work."""
    fn, params, X, y = _mlp_problem(0)
    _, params2, X2, y2 = _mlp_problem(1)

    def fit(p, X, y):
        if selection == "subnetwork":
            sub = pst.subnetwork.from_indices(p, [0, 5, 40, 55])
            return pst.subnetwork_laplace(fn, p, (X, y), Categorical(), sub, progress=False)
        return pst.laplace(fn, p, (X, y), Categorical(), structure="kfac",
                           subset_of_weights=pst.weights.leaves(p, "layers.1"), progress=False)

    first = fit(params, X, y)
    p_first = pst.predictive.classification(first, X[:7], progress=False)
    with compiles() as events:
        second = fit(params2, X2, y2)
        p_second = pst.predictive.classification(second, X2[:7], progress=False)
        jax.block_until_ready((second, p_second))
    assert events == [], f"{len(events)} compilations on the second call"
    assert not np.allclose(np.asarray(p_first), np.asarray(p_second))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("structure", ["diag", "kfac"])
def test_per_layer_variances_equal_the_jacobian_rows(name, structure):
    """Convolutions (strides, groups, an HWIO kernel), tokens, leaves in no layer, float64: the per-layer
    quadratic forms equal diag(J Σ Jᵀ) from the rows of J, and their forward passes' means the MAP outputs."""
    fn, params, X, Y, lik = CASES[name]
    post = pst.laplace(fn, params, (X, Y), lik, structure=structure, prior_precision=0.7)
    T = X[:5] * 1.1
    mean, var = pst.predictive.linearized(post, T)
    ref = _row_values(post, T, 5, var.shape[1], False)
    assert np.ptp(np.asarray(ref)) > 0
    assert_close(var, ref, rtol=1e-10)
    assert_close(mean, post.map_outputs(T), rtol=1e-12)  # the means from the per-layer rules' forward passes


def test_a_model_wrapped_again_reuses_the_compiled_fit_and_predictive():
    """`from_equinox` returns a `BoundModel`: the same architecture wrapped again (new weights, as after more
    training) is an equal model function, so a refit through it compiles nothing and reads the new weights."""
    def wrapped(seed):
        return from_equinox(eqx.nn.MLP(6, 3, 8, 2, activation=jnp.tanh, key=jax.random.key(seed)))

    X = draws.normal(jax.random.key(5), (40, 6))
    y = jnp.arange(40) % 3
    fn0, params0 = wrapped(0)
    fit = lambda fn, p: pst.laplace(fn, p, (X, y), Categorical(), structure="diag", batch_size=16)  # noqa: E731
    jax.block_until_ready(pst.predictive.classification(fit(fn0, params0), X[:7]))
    fn1, params1 = wrapped(1)
    assert fn1 == fn0 and fn1 is not fn0
    with compiles() as events:
        post = fit(fn1, params1)
        probs = jax.block_until_ready(pst.predictive.classification(post, X[:7]))
    assert events == [], f"{len(events)} compilations after wrapping the model again"
    fresh = fit(lambda p, x: fn1(p, x), params1)  # a closure of its own: compiled anew, the same values
    assert_close(post.ggn.g, fresh.ggn.g, rtol=1e-6)
    assert_close(probs, pst.predictive.classification(fresh, X[:7]), rtol=1e-6)


def test_ravel_and_unravel_called_eagerly_compile_one_program_each_per_structure():
    """Eagerly, `ravel` and `Unravel` run as one program each (they used to run a reshape, a cast and a slice per
    leaf, each compiled on its own: 11 programs for these four leaves); a tree of the same structure with new
    values compiles nothing. The values are `ravel_pytree`'s, and the way back is exact."""
    rng = np.random.default_rng(0)

    def tree():
        return {"w": jnp.asarray(rng.standard_normal((3, 5)), jnp.float32), "b": jnp.asarray(rng.standard_normal(5)),
                "k": [jnp.asarray(rng.standard_normal((2, 2, 3))), jnp.asarray(rng.standard_normal(()))]}

    first, second = tree(), tree()
    shifted = jnp.asarray(np.arange(33.0))  # a flat vector of new values for the way back
    with compiles() as events:
        flat, unravel = ravel(first)
        back = unravel(flat)
    assert len(events) == 2, len(events)
    with compiles() as events:
        flat2, unravel2 = ravel(second)
        back2 = unravel2(shifted)
    assert events == [], f"{len(events)} compilations for a tree of the same structure"
    assert_close(flat2, jax.flatten_util.ravel_pytree(second)[0], rtol=0)
    assert flat.dtype == jnp.float64 and flat.shape == (3 * 5 + 5 + 12 + 1,)
    expected = {"b": np.arange(5.0), "k": [np.arange(5.0, 17.0).reshape(2, 2, 3), np.asarray(17.0)],  # leaf order
                "w": np.arange(18.0, 33.0).reshape(3, 5).astype(np.float32)}
    for got, want in ((back, first), (back2, expected)):
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert_close(g, w, rtol=0)


def test_bound_models_differ_by_architecture_and_compare_array_fields_by_identity():
    class Shifted(eqx.Module):
        linear: eqx.nn.Linear
        index: jax.Array  # an integer array: not a parameter, held by the model function

        def __call__(self, x):
            return self.linear(x)[self.index]

    lin = eqx.nn.Linear(3, 4, key=jax.random.key(0))
    module = Shifted(lin, jnp.array([0, 2]))
    assert from_equinox(module)[0] == from_equinox(module)[0]  # the same index array
    assert from_equinox(module)[0] != from_equinox(Shifted(lin, jnp.array([0, 2])))[0]  # another one
    assert from_equinox(eqx.nn.Linear(3, 4, key=jax.random.key(0)))[0] != from_equinox(
        eqx.nn.Linear(3, 5, key=jax.random.key(0)))[0]
    fn, params = from_equinox(module)
    assert_close(fn(params, jnp.ones(3)), module(jnp.ones(3)))


def _second_call_compiles(call):
    first = call(0)
    with compiles() as events:
        second = jax.block_until_ready(call(1))
    return first, second, events


def test_fit_gp_fsp_laplace_and_subnetwork_laplace_compile_once():
    from linops.kernels import RBF, Matern52, fit_gp
    from linops.likelihoods import Gaussian
    from posteriors.fsp import GPPrior

    X = jnp.linspace(-3, 3, 24)[:, None]
    first, second, events = _second_call_compiles(
        lambda i: fit_gp(RBF(lengthscale=3.0 + i), X, jnp.sin(2 * X[:, 0]) * (1 + i), num_steps=20)
        .log_marginal_likelihood)
    assert events == [] and not np.allclose(first, second)

    fn, params = from_equinox(eqx.nn.MLP(1, 1, 8, 2, activation=jnp.tanh, key=jax.random.key(0)))
    scaled = lambda i: jax.tree_util.tree_map(lambda a: a * (1 + 0.5 * i), params)  # noqa: E731
    first, second, events = _second_call_compiles(
        lambda i: pst.fsp_laplace(fn, scaled(i), (X, jnp.sin(X)), GPPrior(Matern52(lengthscale=1.0 + i)), X[::2],
                                  likelihood=Gaussian(0.1), rank=6).d)
    assert events == [] and not np.allclose(first, second)
    images, fn_img = X.reshape(24, 1, 1), lambda p, x: fn(p, x.reshape(-1))  # noqa: E731  (inputs of any shape)
    first, second, events = _second_call_compiles(
        lambda i: pst.fsp_laplace(fn_img, scaled(i), (images, jnp.sin(X)), GPPrior(Matern52(lengthscale=1.0 + i)),
                                  images[::2], likelihood=Gaussian(0.1), rank=6, progress=False).d)
    assert events == [] and not np.allclose(first, second)

    sub = pst.subnetwork.from_indices(params, jnp.arange(0, 20, 2))
    first, second, events = _second_call_compiles(
        lambda i: pst.subnetwork_laplace(fn, scaled(i), (X, jnp.sin(X)), Gaussian(0.1), sub).factor)
    assert events == [] and not np.allclose(first, second)


@pytest.mark.parametrize("loss", [False, True])
@pytest.mark.parametrize("store", ["rows", True, False, pytest.param("narrow rows", marks=pytest.mark.slow)])
def test_a_projected_posterior_refit_compiles_nothing_and_projects_onto_the_new_kernel(store, loss):
    """The row maps are structural (the model function, not a fresh closure per fit), so building the batches'
    factors and projecting reuse their programs on new weights and data; the cached programs read the new
    arrays: the samples' deviations lie in the kernel of the new Jacobian, not the old one's. The same with the
    rows kept in a narrower dtype (float32 for these float64 weights), and with the linearisations stored (True),
    whose recipe, a traced program new at every trace, made every fit a new structure until 2026-12-02."""
    fn = _mlp_problem(0)[0]  # a refit calls the same model function on new weights and data
    options = dict(store_linearization="rows", row_dtype="float32") if store == "narrow rows" else \
        dict(store_linearization=store)

    def fit(i):
        _, params, X, y = _mlp_problem(i)
        X = X[:10] * (1.0 + i)
        if loss:
            return fn, params, X, pst.loss_projected_posterior(fn, params, (X, y[:10]), Categorical(), batch_size=5,
                                                               progress=False, **options)
        return fn, params, X, pst.projected_posterior(fn, params, X, batch_size=5, progress=False, **options)

    def deviations(post):
        return post.projection.project_samples(draws.normal(jax.random.key(2), (post.projection.size, 3)))

    _, _, _, first = fit(0)
    d1 = jax.block_until_ready(deviations(first).value)
    with compiles() as events:
        _, params, X, second = fit(1)
        d2 = jax.block_until_ready(deviations(second).value)
    assert events == [], f"{len(events)} compilations on a refit"
    if store == "narrow rows":
        assert {a.dtype for a in second.projection.stored[:-1]} == {np.dtype("float32")}
    flat, unravel = ravel(params)
    J = jax.jacrev(lambda f: jax.vmap(lambda x: fn(unravel(f), x))(X))(flat)  # (N, O, P) at the new weights
    if loss:  # rows g_n J_n, g_n the categorical loss gradient at the outputs
        out = jax.vmap(lambda x: fn(params, x))(X)
        _, y = _mlp_problem(1)[2:]
        J = jnp.einsum("no,nop->np", jax.nn.softmax(out) - jax.nn.one_hot(y[:10], 3), J)
    J = np.asarray(J).reshape(-1, J.shape[-1])
    d1, d2 = np.asarray(d1), np.asarray(d2)
    assert np.linalg.norm(J @ d2) < 1e-4 * np.linalg.norm(J) * np.linalg.norm(d2)
    assert np.linalg.norm(J @ d1) > 1e-2 * np.linalg.norm(J) * np.linalg.norm(d1)  # the old kernel is not it


@pytest.mark.parametrize("store", ["rows", None])
def test_a_projected_posterior_with_the_optimal_prior_and_its_predictive_refit_compile_nothing(store):
    """The trace probes' blocks, the rank's statistics (on the host) and the predictive on the fit's draws: a refit
    on new weights and data of the same shapes, with as many probes, compiles nothing, calls the model's Python
    code not once, and gives a new alpha*. On stored rows, and at the default storage, which stores this MLP's
    linearisations: until 2026-12-02 their recipe (a traced program) was static data of the projection, new at
    every fit, so a refit traced the model and compiled the projection (2.5 s) and the predictive again."""
    fn, params0 = from_equinox(_Counted(eqx.nn.MLP(6, 3, 8, 2, activation=jnp.tanh, key=jax.random.key(0))))

    def problem(i):  # new weights and data, same structure (made before the compilations are counted)
        params = jax.tree_util.tree_map(lambda a: a * (1.0 + i), params0)
        X = _mlp_problem(i)[2]
        return jax.block_until_ready((params, X[:6], X[6:9], jax.random.key(i)))

    def fit(problem, probes=20):
        params, X, T, key = problem
        post = pst.projected_posterior(fn, params, X, batch_size=3, prior_precision="optimal",
                                       key=key, num_trace_samples=probes, trace_block=10,
                                       trace_rtol=1e-9,  # never met: every block of 10 probes runs
                                       progress=False, store_linearization=store)
        return post, pst.predictive.classification(post, T, progress=False)

    problems = [problem(i) for i in range(3)]
    with compiles() as events:
        first, p_first = fit(problems[0])
        jax.block_until_ready(p_first)
    # 12 in a fresh process (the batches' gather, factors, ravel, two for the draws, the projection, the probes'
    # sums, the next block's key, the outputs, the draws' moments, their sum and the probit link), against about 50
    # when the gather, sums, joins and link ran as eager jnp operations (before 2026-12-02)
    assert len(events) <= 12, f"the first fit and predictive compiled {len(events)} programs"
    assert first.projection.storage == ("rows" if store else "linearization")
    _TRACES.clear()
    with compiles() as events:
        second, p_second = fit(problems[1])
        jax.block_until_ready(p_second)
    assert events == [], f"{len(events)} compilations on a refit"
    assert _TRACES == [], f"the refit traced the model {len(_TRACES)} times"
    # Another number of probe blocks, as the adaptive trace estimate stops where the values say: the blocks are
    # joined and the predictive's draws taken in blocks on the host, so nothing compiles either (before
    # 2026-12-02: 13 programs here and on a small CNN: the eager joins, reductions and the predictive's moments).
    with compiles() as events:
        third, p_third = fit(problems[2], probes=30)
        jax.block_until_ready(p_third)
    assert events == [], f"{len(events)} compilations on a refit with 3 probe blocks instead of 2"
    assert third.trace_draws.shape == (third.projection.size, 30) and third.trace_estimate.num_samples == 30
    assert second.trace_estimate.num_samples == first.trace_estimate.num_samples == 20
    assert float(second.prior_precision) != float(first.prior_precision)
    assert not np.allclose(p_first, p_second)


class _CNN(eqx.Module):
    """Two 3x3 convolutions, a max-pool and two dense layers: the CNN the compile goals are stated on."""

    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    l1: eqx.nn.Linear
    l2: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.c1, self.c2 = eqx.nn.Conv2d(1, 4, 3, key=k[0]), eqx.nn.Conv2d(4, 4, 3, key=k[1])
        self.l1, self.l2 = eqx.nn.Linear(16, 16, key=k[2]), eqx.nn.Linear(16, 5, key=k[3])

    def __call__(self, x):
        x = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x))))
        return self.l2(jax.nn.relu(self.l1(eqx.nn.MaxPool2d(2, 2)(x).reshape(-1))))


@pytest.mark.parametrize("structure", ["diag", "kfac", "last_layer"])
def test_a_first_cnn_fit_and_predictive_compile_one_program_each_and_a_refit_none(structure):
    """256 images in batches of 64: the first `laplace` and `classification(link="probit")` compile at most 10 programs
    (the goal; measured: one each, as one compiled program per public call makes them); the same call again and a
    refit on new weights and new images compile none, and give the new arrays' values."""
    fn, params = from_equinox(_CNN(jax.random.key(0)))
    params2 = jax.tree_util.tree_map(lambda a: 1.1 * a, params)
    X = [draws.uniform(jax.random.key(1 + i), (256, 1, 8, 8)) for i in (0, 1)]
    y = [jax.random.randint(jax.random.key(3 + i), (256,), 0, 5) for i in (0, 1)]
    jax.block_until_ready((params2, X, y))

    def run(p, i):
        post = pst.laplace(fn, p, (X[i], y[i]), Categorical(), **axes(structure), batch_size=64, progress=False)
        return post, jax.block_until_ready(pst.predictive.classification(post, X[i], link="probit", progress=False))

    with compiles() as first:
        post, probs = run(params, 0)
    with compiles() as again:
        run(params, 0)
    with compiles() as refit:
        post2, probs2 = run(params2, 1)
    assert len(first) <= 10 and len(first) == 2, f"{len(first)} compilations on the first fit and predictive"
    assert again == [] and refit == [], f"{len(again)} and {len(refit)} compilations on the second calls"
    assert not np.allclose(np.asarray(probs), np.asarray(probs2))
    _, var = pst.predictive.linearized(post2, X[1][:8])
    assert_close(var, _row_values(post2, X[1][:8], 8, 5, False), rtol=1e-4)


def test_a_jaxlib_that_refuses_the_compile_option_gets_the_plain_program(monkeypatch):
    """`linops.runtime.program` asks XLA for an option of its CPU back end; a jaxlib without it refuses the
    compilation (``No such compile option``), and the call then runs the plain program, once refused never
    asking again."""
    from linops.runtime import _compile

    monkeypatch.setattr(_compile, "_known", [True])
    monkeypatch.setattr(_compile, "COMPILER_OPTIONS", {"xla_an_option_no_jaxlib_has": False})
    double = _compile.program(lambda x: 2.0 * x)
    assert_close(double(jnp.arange(3.0)), jnp.array([0.0, 2.0, 4.0]), rtol=0)
    assert _compile._known == [False]
    assert_close(double(jnp.ones(2)), jnp.full(2, 2.0), rtol=0)
    monkeypatch.setattr(_compile, "_known", [True])
    monkeypatch.setattr(_compile, "COMPILER_OPTIONS", {"xla_cpu_use_fusion_emitters": False})
    assert_close(_compile.program(lambda x: 2.0 * x)(jnp.ones(2)), jnp.full(2, 2.0), rtol=0)
    assert _compile._known == [True], "the option this jaxlib knows is accepted"
