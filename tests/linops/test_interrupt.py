"""Ctrl-C stops a long compiled program at its next progress callback, with a clean ``KeyboardInterrupt``.

Each case runs in a fresh process (Python's signal handling belongs to its main thread) that sends itself SIGINT
once a computation that would otherwise run for hours is running (its first progress update has happened: the
program is compiled and XLA runs it, so the main thread is waiting in the runtime), and prints how it ended.
The subprocess's timeout only guards against a hang (after 240 s the process prints every thread's stack and
ends, so a hang says where it was); nothing here asserts a duration.
"""

import subprocess
import sys
import textwrap

import pytest

from tests._env import user_env

PREAMBLE = """
import faulthandler, os, signal, threading, time
faulthandler.dump_traceback_later(240, exit=True)   # a hang ends by printing where every thread was
# Python keeps SIGINT ignored if it was ignored when it started: a job a non-interactive shell put in the
# background (`pytest &`) ignores SIGINT, and so does every process it starts. A user at a terminal has Python's
# handler; so does this process.
signal.signal(signal.SIGINT, signal.default_int_handler)
import jax, jax.numpy as jnp
def interrupt_when_running():
    from linops.runtime import _progress
    def watch():
        while not _progress._BARS:   # no progress update yet: still compiling, or not started
            time.sleep(0.01)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=watch, daemon=True).start()
def run(call):
    try:
        call()
        print("FINISHED")
    except KeyboardInterrupt:
        print("INTERRUPTED")
    except BaseException as e:
        print("OTHER", type(e).__name__, str(e)[:300])
"""

PROGRAM = """
from linops.runtime import program, tick
@program
def long(x, label="long"):
    def step(i, x):
        tick(label, i + 1, 10**9, unit="step")
        return x + 1e-9 * jnp.sin(x)
    return jax.lax.fori_loop(0, 10**9, step, x)
interrupt_when_running()             # the signal waits for the first tick: compiled and running
run(lambda: long(jnp.ones(3)))
"""

PROJECTION = """
import equinox as eqx
import linops as lo
from linops.models import from_equinox
fn, params = from_equinox(eqx.nn.MLP(64, 4, 64, 2, key=jax.random.key(0)))
X = jax.random.normal(jax.random.key(1), (200, 64))
A = lo.AlternatingProjectionOp.from_jacobian(fn, params, X, batch_size=4, max_sweeps=10**8, rtol=1e-30,
                                             method="plain", progress=True)
interrupt_when_running()
run(lambda: A.project(jax.random.normal(jax.random.key(2), (A.shape[0],))).value.block_until_ready())
print("AFTER", float(jnp.sum(jnp.ones(3))))   # the process goes on working
"""


@pytest.mark.parametrize("case", ["program", pytest.param("projection", marks=pytest.mark.slow)])  # 7 s
def test_ctrl_c_stops_a_running_program_with_keyboard_interrupt(case):
    body = PROGRAM if case == "program" else PROJECTION
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(PREAMBLE + body)], capture_output=True, text=True,
                         timeout=300, env=user_env(TQDM_DISABLE="1"))
    lines = out.stdout.split()
    assert "INTERRUPTED" in lines and "FINISHED" not in lines, out.stdout + out.stderr[-3000:]
    if case == "projection":
        assert "AFTER" in lines, out.stdout + out.stderr[-3000:]


def test_ctrl_c_counts_when_pythons_handler_fires_inside_the_check(monkeypatch):
    """The race CI met once: the check reads SIGINT's byte off the pipe, then Python's own handler raises
    ``KeyboardInterrupt`` before the byte is noted. The call must still end as interrupted (not as a runtime
    error out of its callback)."""
    import os

    from linops.runtime import _interrupt

    read, write = os.pipe()
    try:
        monkeypatch.setattr(_interrupt, "_PIPE", [read])
        monkeypatch.setattr(_interrupt, "_SEEN", [False])

        real_read = os.read

        def read_then_interrupted(fd, n):
            real_read(fd, n)  # the byte leaves the pipe ...
            raise KeyboardInterrupt  # ... and the handler runs before check() sees it

        os.write(write, bytes([2]))  # SIGINT's number, as the C-level handler writes it
        with monkeypatch.context() as m:
            m.setattr(_interrupt.os, "read", read_then_interrupted)
            with pytest.raises(KeyboardInterrupt):
                _interrupt.check()
        os.set_blocking(read, False)
        assert _interrupt.was_interrupted()
    finally:
        os.close(read)
        os.close(write)
