"""The environment a user's command runs in: the test session's XLA settings (tests/conftest.py) removed."""

import os

SESSION_XLA_FLAG = "--xla_backend_optimization_level=0"


def user_env(**extra):
    """``os.environ`` without the test session's own XLA flag, plus ``extra``."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != SESSION_XLA_FLAG)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags:
        env["XLA_FLAGS"] = flags
    return {**env, **extra}
