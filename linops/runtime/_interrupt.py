"""Ctrl-C during a compiled program: stop it at its next progress tick, not when it ends.

While XLA runs a program, Python's main thread waits inside the runtime and runs no signal handler, so
a ``KeyboardInterrupt`` would arrive only once the whole program (a fit, a projection's sweeps) has
finished. `interruptible` (around each public call's program, `linops.runtime.program`) asks Python to
note every signal on a pipe as well (`signal.set_wakeup_fd`: written by the C-level handler at once,
whatever the main thread is doing). The progress callbacks that long programs make on the host every step
(`linops.runtime.tick`, a projection's sweeps) read that pipe (`check`): after Ctrl-C the next one raises,
which aborts the program, and the call raises ``KeyboardInterrupt``.

Only a program that reports progress (the default, ``progress=True``) can be stopped this way; where
another library already uses the wakeup descriptor (an asyncio event loop, a notebook kernel), or off the
main thread, calls run as before. No state outlives a call: the descriptor is restored afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_PIPE: list = [None]  # the read end of the pipe while an interruptible call runs
_SEEN: list = [False]  # whether that call's pipe has carried SIGINT
_FDS: list = []  # (read, write): the pipe, made once per process


class Interrupted(Exception):
    """Raised on the host, inside a progress callback, once Ctrl-C was pressed: it aborts the running program."""


def check() -> None:
    """In a host callback of a running program: raise `Interrupted` if SIGINT arrived since the call began."""
    fd = _PIPE[0]
    if fd is None:
        return
    try:
        try:
            data = os.read(fd, 512)
        except (BlockingIOError, OSError):
            data = b""
        if signal.SIGINT in data:
            _SEEN[0] = True
    except KeyboardInterrupt:
        # On the main thread Python's own handler may run between the read, which took SIGINT's byte off the
        # pipe, and the note above: the byte is gone, so this is the only record that Ctrl-C came.
        _SEEN[0] = True
        raise
    if _SEEN[0]:
        raise Interrupted("interrupted by SIGINT (Ctrl-C)")


@contextlib.contextmanager
def interruptible():
    """Within: a SIGINT stops the running program at its next progress callback (see the module docstring).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.runtime._interrupt import interruptible
        >>> with interruptible():
        ...     total = float(jnp.arange(4.0).sum())
        >>> total
        6.0
    """
    if _PIPE[0] is not None or threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # Ctrl-C handled otherwise
        yield
        return
    if not _FDS:  # one pipe for the process, made on first use and kept (a call only borrows the descriptor)
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        _FDS.extend((read, write))
    read, write = _FDS
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):  # no signal support here
        yield
        return
    if previous != -1:  # someone else's (an event loop's): theirs stays
        signal.set_wakeup_fd(previous)
        yield
        return
    _drain(read)
    _PIPE[0], _SEEN[0] = read, False
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        _PIPE[0] = None


def _drain(fd) -> None:
    """Empty the pipe of signals noted before this call."""
    try:
        while os.read(fd, 512):
            pass
    except (BlockingIOError, OSError):
        pass


def active() -> bool:
    """Whether an interruptible call is running (its pipe is open)."""
    return _PIPE[0] is not None


def was_interrupted() -> bool:
    """Whether SIGINT arrived during the running interruptible call (its program was aborted by `check`, or by
    the ``KeyboardInterrupt`` Python raised in a callback run on this thread)."""
    try:
        check()
    except Interrupted:
        pass
    return _SEEN[0]
