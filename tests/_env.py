"""The environment a user's command runs in: the test session's XLA settings (tests/conftest.py) removed."""

import os
from importlib.metadata import version

# The test session's XLA flags (tests/conftest.py adds each one XLA_FLAGS does not already set):
# the LLVM back end at optimisation level 0, and XLA's CPU loop emitters instead of its newer MLIR fusion
# emitters, which take about three times as long to compile the suite's programs.
SESSION_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")

# A work-around, not a speed setting, so the commands a test starts keep it (user_env): jaxlib 0.10.2 (and
# 0.11.0) hand dot products to XLA:CPU's new YNNPACK fusions, whose kernels fault on some x86-64 CPUs (jax issues
# 39257 and 40412; `jnp.sum(a * b, axis=3)` of two float32 arrays of shape (3, 1, 2, 2, 8, 8, 8) ends Python
# with a segmentation fault on this project's AMD EPYC machines). The fault happens on one of XLA's worker threads,
# so the Python traceback names whatever the main thread was doing (compiling an unrelated `+`): one CI run and two
# local runs of the suite lost a worker, in three different test files (and one run saw two subprocess tests hang
# past their 5-minute guard, the fault's other face in jax issue 39257). An empty fusion type
# turns those fusions off (jaxlib's own dot kernels run instead). jaxlib before 0.10.1 does not know the flag,
# and XLA refuses unknown flags, so it is added only from 0.10.1 on. Not in the distributed tier, which runs with
# JAX's defaults as users do: with the other kernels' rounding, CG on split sweeps over 4 devices stalls in
# float64 (kernel residual 7e-5 against the 1.7e-6 its flag needs, 1.5% off: reported not converged), where with
# YNNPACK's it converges (5e-7 off) (tests/distributed/test_sharded.py; issue 38's split sweeps).
_JAXLIB = tuple(int(part) for part in version("jaxlib").split(".")[:3] if part.isdigit())
WORKAROUND_XLA_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",) if _JAXLIB >= (0, 10, 1) else ()


def session_flags(xla_flags: str) -> str:
    """``xla_flags`` with each of `WORKAROUND_XLA_FLAGS` and `SESSION_XLA_FLAGS` whose option it does not set
    already appended."""
    for flag in WORKAROUND_XLA_FLAGS + SESSION_XLA_FLAGS:
        if flag.split("=")[0] not in xla_flags:
            xla_flags = f"{xla_flags} {flag}"
    return xla_flags.strip()


def user_env(**extra):
    """``os.environ`` without the test session's own speed flags (the work-around stays), plus ``extra``."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in SESSION_XLA_FLAGS)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags:
        env["XLA_FLAGS"] = flags
    return {**env, **extra}
