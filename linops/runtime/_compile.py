"""`program`: how the library compiles the program of a public call (a fit, a predictive, an evidence).

`equinox.filter_jit`, asking XLA's CPU back end for its loop emitters instead of its fusion emitters
(``xla_cpu_use_fusion_emitters=False``, an option of that one program, never a global setting). Users wait
on compilation more than on computation: on LeNet-5 (N = 1,024, batches of 128, 2 cores; XLA's compile
seconds of the first fit + first class-probability predictive) the option cut the diagonal posterior's from
5.5 s to 2.7 s, KFAC's from 7.3 s to 3.8 s and the last layer's from 1.8 s to 1.1 s, and cost 5-10% in the
steady fits and 10-20% in the steady diagonal and KFAC predictives (side by side, `docs/howto/speed.md`).
Other back ends ignore it. A jaxlib that does not know the option gets the plain program (once refused,
never asked again), and so does a call inside another trace (the option belongs to the outermost program,
which inlines this one). A top-level call can be stopped with Ctrl-C at its next progress tick
(`linops.runtime._interrupt`): it then waits for its program's result before returning.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax

from linops.runtime import _interrupt

COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
_REFUSED = "No such compile option"
_NESTED = "can only be passed to top-level"
_known = [True]  # whether this jaxlib accepts COMPILER_OPTIONS (a fact about the installed jaxlib, not a setting)


def program(fn=None, **jitkwargs):
    """``equinox.filter_jit(fn, **jitkwargs)`` compiled with `COMPILER_OPTIONS` (usable as a decorator).

    Arrays are traced and everything else is static, as with `equinox.filter_jit`: operators of one
    structure and shape share the compiled program. Inside another trace it is the plain
    `equinox.filter_jit` (the outermost program's options apply).

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.runtime import program
        >>> @program
        ... def energy(x, scale=2.0):
        ...     return scale * jnp.vdot(x, x)
        >>> energy(jnp.arange(3.0)), energy(jnp.ones(3), scale=0.5)
        (Array(10., dtype=float32), Array(1.5, dtype=float32))
    """
    if fn is None:
        return functools.partial(program, **jitkwargs)
    fast = eqx.filter_jit(fn, compiler_options=COMPILER_OPTIONS, **jitkwargs)
    plain = eqx.filter_jit(fn, **jitkwargs)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return plain(*args, **kwargs)  # inside another trace: the outermost program's options apply
        with _interrupt.interruptible():
            try:
                return _run(args, kwargs)
            except (jax.errors.JaxRuntimeError, _interrupt.Interrupted):
                if _interrupt.was_interrupted():
                    raise KeyboardInterrupt(f"{getattr(fn, '__name__', 'program')} stopped by Ctrl-C") from None
                raise

    def _run(args, kwargs):
        out = _unwaited(args, kwargs)
        # while Ctrl-C can stop the program, wait for it here (the progress callbacks watch for it meanwhile)
        return jax.block_until_ready(out) if _interrupt.active() else out

    def _unwaited(args, kwargs):
        if not _known[0]:
            return plain(*args, **kwargs)
        try:
            return fast(*args, **kwargs)
        except jax.errors.JaxRuntimeError as error:
            if _REFUSED not in str(error):
                raise
            _known[0] = False  # this jaxlib does not know the option: never asked again
        except ValueError as error:  # inside a trace all the same (a closure over traced values)
            if _NESTED not in str(error):
                raise
        return plain(*args, **kwargs)

    return call
