"""Test session set-up: float64 and strict promotion for the algebra, Hypothesis profiles."""

import os

import jax
from hypothesis import HealthCheck, settings
from jaxtyping import install_import_hook

from tests._env import SESSION_XLA_FLAG

# Check the jaxtyping shapes on public signatures at run time, in the test session only.
# Only the public functions (solve, diag, ...): checking every operator's construction and
# product doubles the suite's time for little extra safety.
_CHECKED = ["linops._functions"]
with install_import_hook(_CHECKED, "beartype.beartype"):
    import linops  # noqa: F401

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("deep", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """XLA's LLVM back end at optimisation level 0 in the test session (set before JAX starts its back end,
    which no import above does): the default suite is dominated by compiling many small programs once each
    (measured: 8:00 and 9:16 against 9:44 on 2 cores, the same results to the tolerances asserted). XLA's own program
    optimisations (fusion, simplification, buffer assignment, hence memory) are unchanged. Not in the
    distributed tier: its sharded-against-one-device comparisons include CG on split sweeps, which depends on
    rounding (at level 0, one of six samples stalls, with the library's warning), and an FSP covariance compared
    at 1e-10; it runs at JAX's default level, as users do. Set --xla_backend_optimization_level in XLA_FLAGS
    yourself to choose; the reproduction tier's commands and the notebooks run with JAX's defaults
    (tests/_env.py)."""
    if "distributed" in (config.option.markexpr or "").replace("not distributed", ""):
        return
    if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SESSION_XLA_FLAG).strip()
