"""The environment a user's command runs in: the test session's XLA settings (tests/conftest.py) removed."""

import os

# The test session's XLA flags (tests/conftest.py adds each one XLA_FLAGS does not already set):
# the LLVM back end at optimisation level 0, and XLA's CPU loop emitters instead of its newer MLIR fusion
# emitters, which take about three times as long to compile the suite's programs.
SESSION_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def session_flags(xla_flags: str) -> str:
    """``xla_flags`` with each of `SESSION_XLA_FLAGS` whose option it does not set already appended."""
    for flag in SESSION_XLA_FLAGS:
        if flag.split("=")[0] not in xla_flags:
            xla_flags = f"{xla_flags} {flag}"
    return xla_flags.strip()


def user_env(**extra):
    """``os.environ`` without the test session's own XLA flags, plus ``extra``."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in SESSION_XLA_FLAGS)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags:
        env["XLA_FLAGS"] = flags
    return {**env, **extra}
