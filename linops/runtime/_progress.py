"""Progress bars for long operations, drawn on the host by tqdm (``tqdm.auto``: a widget in notebooks, a
line redrawn in place on a terminal), and driven from inside compiled programs by `jax.debug.callback`.

A bar appears only once its operation has run for `DELAY` seconds, so quick calls print nothing; every
operation that takes one has a switch to silence it (``progress=False``). Where stderr is not a
terminal (a CI log, a file), the bar is redrawn at most every `LOG_INTERVAL` seconds, so a log gets a
few lines rather than one per step. ``TQDM_DISABLE=1`` in the environment silences every bar.

A bar never stops the computation it reports on: with no stderr (``pythonw``, ``sys.stderr`` None) it
is silent, and a write that fails (a closed stream, a pipe whose reader has gone) is dropped.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from linops.runtime import _interrupt

DELAY = 2.0
"""Seconds an operation runs before its bar appears."""

LOG_INTERVAL = 30.0
"""Seconds between redraws where stderr is not a terminal."""


def check_label(progress, who: str) -> None:
    """A progress option of a linops operation is a label (``str``) or None: anything else is refused."""
    if progress is not None and not isinstance(progress, str):
        raise TypeError(f"{who}: progress must be a label (str) or None, got {type(progress).__name__} "
                        f"{progress!r}")


def new_bar(desc: str, total: int | None, unit: str = "it"):
    """A tqdm bar on stderr with this module's delay and redraw interval (for a loop run on the host).

    Examples:
        >>> from linops.runtime import new_bar
        >>> bar = new_bar("grid", 3, unit="value")    # drawn only once the loop has run 2 seconds
        >>> for _ in range(3):
        ...     _ = bar.update(1)
        >>> bar.close(); bar.n
        3
    """
    from tqdm.auto import tqdm

    stream = sys.stderr
    if stream is None or getattr(stream, "closed", False):  # pythonw, or stderr closed: nowhere to draw
        return tqdm(desc=desc, total=total, unit=unit, disable=True)
    stream = _GuardedStream(stream)
    interval = 0.1 if stream.isatty() else LOG_INTERVAL
    return tqdm(desc=desc, total=total, unit=unit, delay=DELAY, mininterval=interval, maxinterval=max(interval, 10),
                file=stream, dynamic_ncols=True, leave=True)


class _GuardedStream:
    """``stream`` as a bar writes to it: a write or flush that fails (a closed stream, a broken pipe) is dropped,
    never raised into the computation the bar reports on (inside a compiled program's callback, an error would
    abort it)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError, AttributeError):
            return 0

    def flush(self):
        try:
            self._stream.flush()
        except (OSError, ValueError, AttributeError):
            pass

    def isatty(self) -> bool:
        try:  # a stand-in stream (a logger, a recorder) may lack isatty
            return bool(self._stream.isatty())
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self):  # tqdm's terminal width (dynamic_ncols); its caller handles the errors
        return self._stream.fileno()

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", None) or "utf-8"


_BARS: dict = {}  # label -> the open bar of the operation running under that label


def update(label, unit, done, total, note="", close_at_total=True):
    """On the host: the bar ``label`` stands at ``done`` of ``total`` (see `tick`); reaching ``total`` closes
    it unless ``close_at_total`` is False (the operation then ends it with `finish`, and its outcome).

    Examples:
        >>> from linops.runtime import update
        >>> for step in range(1, 4):
        ...     update("training", "step", step, 3, note=f"loss {1 / step:.2f}")   # the third step closes it
    """
    _interrupt.check()  # Ctrl-C since the call began: abort its program here
    done, total = int(done), int(total)
    bar = _BARS.get(label)
    if bar is None or done <= 1 or done < bar.n:  # a new run of the operation
        close(label)
        bar = _BARS[label] = new_bar(label, total, unit)
    bar.total = total
    bar.update(done - bar.n)
    if note:
        bar.set_postfix_str(note, refresh=False)
    if done >= total and close_at_total:
        close(label)


def finish(label: str, note: str = "", done: int | None = None) -> None:
    """On the host: end the open bar of ``label`` at ``done`` steps (default: where it stands), which become
    its total (an operation that stopped early, such as a converged iteration), with ``note`` beside it."""
    _interrupt.check()
    bar = _BARS.get(label)
    if bar is not None:
        if done is not None:
            bar.update(int(done) - bar.n)
        bar.total = bar.n
        if note:
            bar.set_postfix_str(note, refresh=False)
        close(label)


def close(label: str) -> None:
    """Close the bar of ``label`` if one is open (an operation that stopped before its total)."""
    bar = _BARS.pop(label, None)
    if bar is not None:
        bar.close()


def tick(label: str | None, done, total, unit: str = "it", note=None, after=None) -> None:
    """Inside a traced program (or outside one): the bar ``label`` stands at ``done`` of ``total``. A run's
    first step opens a new bar and the step that reaches ``total`` closes it. ``note``: ``(fmt, values)``,
    ``fmt(*values)`` the text beside the bar, formatted on the host. ``after``: values computed before
    this tick (a loop's result), so that it is drawn after the loop's own ticks: callbacks tied to no
    value may run in any order. Nothing for ``label`` None.

    The label is all the state a compiled program holds (a string), so programs that tick compile once per
    label, like any other static option. A tick costs 50 to 160 microseconds on a CPU (an unordered host
    callback; inside a loop, the iterations keep the ticks in order).

    Examples:
        >>> import jax
        >>> from linops.runtime import tick
        >>> def doubling(x, label=None):
        ...     def step(i, x):
        ...         tick(label, i + 1, 3, unit="step", note=("x = {:.1f}".format, (x,)))
        ...         return 2 * x
        ...     return jax.lax.fori_loop(0, 3, step, x)
        >>> jax.jit(doubling, static_argnames="label")(1.0, label="doubling")
        Array(8., dtype=float32, weak_type=True)
    """
    if label is None:
        return
    fmt, values = note if note is not None else (None, ())

    def host(d, t, _, *v):
        update(label, unit, d, t, fmt(*v) if fmt is not None else "")

    jax.debug.callback(host, jnp.asarray(done), jnp.asarray(total), _anchor(after), *values)


def finish_after(label: str | None, after) -> None:
    """Inside a traced program: end the open bar of ``label`` where it stands (`finish`) once ``after`` (a
    pytree of values, such as a loop's result) is computed. Nothing for ``label`` None."""
    if label is None:
        return
    jax.debug.callback(lambda _: finish(label), _anchor(after))


def _anchor(after):
    """One number per leaf of ``after``: a callback given them waits until they are computed."""
    return [jnp.ravel(a)[:1] for a in jax.tree_util.tree_leaves(after)]
