"""Measuring in fresh processes: a child with a time budget whose record survives a kill, and peak memory.

``in_child(job, task, budget_s, log)`` runs ``job(task, rec)`` (a module-level function of the calling script)
in a spawned process, so no JAX state, compiled program or cache is shared with the parent or another child;
``rec`` records what the child measures as it goes, and a child stopped at its budget or killed (out of
memory) still returns what it had recorded. `PeakRSS` times a call and measures the process's peak resident
memory during it. Shared by ``scale.py``, ``lenet_vs_laplace_torch.py``, ``vs_laplace_torch.py`` and
``memory.py``; imported as ``import _processes as procs`` (see ``_harness.py``).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax


class Recorder:
    """What a child process measures, appended to a JSON-lines file as it goes (a killed child leaves what
    it had recorded). ``self(path, value)`` sets ``path`` ("a/b/c"); ``add`` appends to a list there;
    ``context`` names the piece being measured (where an unexpected error is recorded)."""

    def __init__(self, path):
        self.fh, self.t0, self.context = open(path, "a"), time.perf_counter(), "run"  # noqa: SIM115

    def _write(self, op, path, value):
        self.fh.write(json.dumps({"op": op, "path": path, "value": value}, default=_plain) + "\n")
        self.fh.flush()

    def __call__(self, path, value):
        self._write("set", path, value)

    def add(self, path, value):
        self._write("add", path, value)

    def elapsed(self):
        return time.perf_counter() - self.t0


def _plain(x):
    return x.tolist() if hasattr(x, "tolist") else str(x)


def error_text(e: BaseException) -> str:
    """An exception as recorded: its type, message and the last frames of its traceback (bounded)."""
    return f"{type(e).__name__}: {e}"[:2000] + "\n" + "".join(traceback.format_tb(e.__traceback__)[-3:])[-1500:]


def _child(job, task, path, stderr):
    rec = Recorder(path)
    if stderr is not None:
        sys.stderr = stderr(sys.stderr, rec)
    try:
        job(task, rec)
    except BaseException as e:  # noqa: BLE001 - recorded for the parent, which goes on
        rec(f"{rec.context}/error", error_text(e))
        raise


def _merge(events):
    out = {}
    for ev in events:
        *parents, last = ev["path"].split("/")
        node = out
        for k in parents:
            node = node.setdefault(k, {})
        if ev["op"] == "set":
            node[last] = ev["value"]
        else:
            node.setdefault(last, []).append(ev["value"])
    return out


def has_error(d) -> bool:
    """Whether a record holds an ``error`` at any depth."""
    return isinstance(d, dict) and ("error" in d or any(has_error(v) for v in d.values()))


def in_child(job, task, budget_s, log, *, stderr=None):
    """Run ``job(task, rec)`` in a fresh process (spawned: no JAX state shared) for at most ``budget_s``
    seconds: its record (a dict), with ``wall_s``, ``budget_s`` and, where it failed or was stopped, ``error``.

    ``job`` must be a module-level function (it is pickled by name). ``stderr(stream, rec)``, if given, wraps the
    child's standard error (to record progress lines as they come).
    """
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "record.jsonl"
        path.touch()
        proc = ctx.Process(target=_child, args=(job, task, str(path), stderr), daemon=True)
        t0 = time.perf_counter()
        proc.start()
        proc.join(max(budget_s, 1.0))
        stopped = proc.is_alive()
        if stopped:
            proc.terminate()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        wall = time.perf_counter() - t0
        lines = path.read_text().splitlines()
    out = _merge(json.loads(line) for line in lines if line.strip())
    out["wall_s"], out["budget_s"] = wall, budget_s
    if stopped:
        out["error"] = f"stopped: did not finish within its time budget of {budget_s:.0f} s"
    elif proc.exitcode != 0 and not has_error(out):
        out["error"] = f"the child process ended with status {proc.exitcode}" + (
            " (killed by a signal: out of memory?)" if proc.exitcode < 0 else "")
    if out.get("error"):
        log(f"    {job.__name__}: {out['error'].splitlines()[0][:160]}")
    return out


class PeakRSS:
    """Time a call and measure the process's peak resident memory during it above the resident
    memory before it: ``VmHWM`` (reset by writing 5 to ``/proc/self/clear_refs``) minus ``VmRSS``.

    Linux only; elsewhere (or where the reset is refused) the memory is None. It sees every
    allocation of the process (XLA's and PyTorch's alike) that is touched, not only the arrays.
    """

    def __init__(self):
        self.ok = self._reset() and self._field("VmHWM") is not None

    @staticmethod
    def _field(name):
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith(name + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    @staticmethod
    def _reset():
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def call(self, fn, block=True):
        """``(output, seconds, peak bytes above the start or None)``."""
        gc.collect()
        before = None
        if self.ok and self._reset():
            before = self._field("VmRSS")
        t0 = time.perf_counter()
        out = fn()
        if block:
            out = jax.block_until_ready(out)
        seconds = time.perf_counter() - t0
        peak = self._field("VmHWM") if before is not None else None
        return out, seconds, (None if peak is None else max(0, peak - before))
