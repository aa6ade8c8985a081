"""Test session set-up: float64 and strict promotion for the algebra, Hypothesis profiles."""

import os

import jax
from hypothesis import HealthCheck, settings
from jaxtyping import install_import_hook

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
