"""Test session set-up: float64 and strict promotion for the algebra, Hypothesis profiles."""

import gc
import os

import jax
import pytest
from hypothesis import HealthCheck, settings
from jaxtyping import install_import_hook

from tests import _draws
from tests._env import session_flags

# Check the jaxtyping shapes on public signatures at run time, in the test session only.
# Only the public functions (solve, diag, ...): checking every operator's construction and
# product doubles the suite's time for little extra safety.
_CHECKED = ["linops.algebra._functions"]
with install_import_hook(_CHECKED, "beartype.beartype"):
    import linops  # noqa: F401

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
_draws.install()  # the models' initialisers draw jax.random's values through fewer programs (tests/_draws.py)

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("deep", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """The test session's XLA flags (`tests._env.SESSION_XLA_FLAGS`, set before JAX starts its back end, which no
    import above does): the default suite is dominated by compiling many small programs once each, so it compiles
    them with XLA's LLVM back end at optimisation level 0 and with XLA's CPU loop emitters rather than its newer
    MLIR fusion emitters. XLA's own program optimisations (fusion, simplification, buffer assignment, hence
    memory) are unchanged; the results agree to the tolerances asserted. Measured on 2 cores (16 tests of
    test_layer_diag and the LeNet-5 predictive): XLA compile time 111 s at level 0, 38 s with the loop emitters as
    well (wall 152 s -> 81 s); at JAX's default level 3 the loop emitters give 109 s. The whole default suite at
    level 3 (loop emitters kept) took 27.5 minutes on 2 cores with the docs extra installed (2026-11-30; a clean
    clone's run at level 0 took 14 on that machine, without the site's tests), against the 10 it must fit; on a
    quieter run that day, 17.0 minutes against a clean clone's 10.5 at level 0, compilation 1,205 s of the workers'
    1,942 (62%, 19,396 programs). Eager `batched_sum`/`batched_map`, `ravel` and `Unravel`, since compiled as one
    program each, took the count to 16,497; side by side at level 3, test_compile_once and test_nn went from 326 s
    to 289. With JAX's `rbg` generator (cheaper to compile) the suite took 16.2 minutes, and 11 more tests failed
    (every draw changes with the generator; not investigated): not done. Where it goes: the session compiles about
    13,500 distinct programs (counted as the entries of a persistent compilation cache shared by the session, which
    itself saved only 4% of the time: few programs repeat between modules), about 9,000 of them single operations
    run eagerly (reshape 1,124, broadcast 885, transpose 745, add 738, dot_general 596, matmul 545, ...: the tests'
    dense references and operators applied outside `jax.jit`), and 292 `jax.random.normal`/`uniform` draws of the
    tests' data, whose threefry programs take 0.6-1 s each to compile at level 3 (0.2 s for `unsafe_rbg`'s, 0.1 s at
    level 0). The tests draw their data through `tests._draws` (flat draws, the same values: 398 s of random programs'
    compilation at level 3 became 244 s, the suite 22:29 -> 20:32, 2026-12-01). Two tests fail there, their original
    tolerances asking more than float32 rounding (CG's recomputed residual against float64 at 1e-3: 3.2% off) and CG's
    convergence rule (a projection's error below 1e-6: 1.1e-6, within the rule's 3.2e-4) promise; kept, with those
    promises checked beside them. The models' initialisers in equinox and flax draw through `tests._draws` as well
    (`_draws.install`, at import above; 2026-12-02, three heavy modules at level 3 side by side: 145/149 s ->
    121/130 s).

    Not in the distributed tier: its sharded-against-one-device comparisons include CG on split sweeps, which
    depends on rounding (at level 0, one of six samples stalls, with the library's warning), and an FSP covariance
    compared at 1e-10; it runs at JAX's default level, as users do (CI adds the loop emitters, with which all of
    it passes). Set either option in XLA_FLAGS yourself to
    choose (``--xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=true`` tests as JAX compiles by
    default); the reproduction tier's commands and the notebooks run with JAX's defaults (tests/_env.py).

    The default and slow tiers, and every command their tests start, also get `tests._env.WORKAROUND_XLA_FLAGS`:
    XLA:CPU's YNNPACK fusions of jaxlib 0.10.2 fault on worker threads on some x86-64 CPUs. Not the distributed
    tier (see there)."""
    if "distributed" in (config.option.markexpr or "").replace("not distributed", ""):
        return  # JAX's defaults, kernels included (tests._env.WORKAROUND_XLA_FLAGS says why)
    os.environ["XLA_FLAGS"] = session_flags(os.environ.get("XLA_FLAGS", ""))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Each test module's compiled programs are dropped when it ends (`jax.clear_caches`): a worker otherwise keeps
    every program of every module it ran, and grew past 4 GB (issue 39). Measured in one process on four heavy
    modules (test_laplace, test_compile_once, test_predictive, linops/test_nn): peak 4.41 GB kept, 2.75 GB dropped,
    and no slower (476 s against 356 s, on a shared machine). Programs are not shared between modules: a refit's
    compile counts are asserted inside one test."""
    yield
    jax.clear_caches()
    gc.collect()


# --- a test whose worker process died (a native crash inside XLA) runs once more, in a fresh worker --------------
_CRASHED: list = []


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist: a test whose worker died runs once more in a fresh worker; a second death is its failure.

    jaxlib 0.10.2's XLA:CPU segfaults now and then on this project's x86-64 machines, faulthandler's trace showing
    the main thread compiling a program as small as `jax.random.normal`'s: CI lost a run to it, and local runs of
    the suite lost a worker in four different test files, each test passing when run again; turning off the
    YNNPACK fusions (tests/_env.py) did not end it. A test is not retried on a failed assertion: only on the death
    of its process, and only once; the terminal summary names it, and a second death fails it.
    """
    if crashitem in _CRASHED:
        return None
    _CRASHED.append(crashitem)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"
    return True


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    if _CRASHED:
        terminalreporter.section("worker crashes", sep="=", yellow=True)
        for nodeid in _CRASHED:
            terminalreporter.line(f"{nodeid}: its worker process died (a native crash); run again in a fresh worker "
                                  "(its result is in the summary above)")


# --- the longest tests first, so that the two workers of the default suite finish together -------------------------
# pytest-xdist hands out tests in collection order. tests/test_docstrings.py's two interpreters (about 80 and 55 s
# at optimisation level 0, 155 and 99 s at level 3; every other test takes 20 s at most) were collected near the
# end, where the worker that drew them could be left running them alone after the other had run out of tests: work
# stealing (pyproject.toml) moves queued tests, not a running one. Taken first (longest processing time first),
# they run while the rest are handed out around them.
_LONGEST_FIRST = ("tests/test_docstrings.py::test_docstring_examples_run",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(_LONGEST_FIRST))  # stable: the rest keep their order
