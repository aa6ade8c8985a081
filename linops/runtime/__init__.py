"""The runtime under the algebra: how a computation is compiled, streamed over examples and reported.

- `program`: how the library compiles the program of a public call (`equinox.filter_jit` with XLA's CPU
  loop emitters, an option of that program only).
- `batched_map`, `batched_sum`: a function over the examples in batches (`lax.scan` over the full batches,
  then the short last batch on its own, never dropped), the convolutions of the loop body in the layout
  XLA's CPU back end runs fast.
- `tick`, `new_bar`, `update`: progress bars drawn on the host, driven from inside compiled programs.
- `has_conv`: whether a traced program has a convolution.
- `flat_draw`: a `jax.random` draw of any shape, compiled as a flat one (the same values).

The algebra, the network operators and the posteriors build on these names; this package imports none of
them. Use them to give your own posterior the library's batching, compilation and progress bars.

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.runtime import batched_sum, program
    >>> total = program(lambda x: batched_sum(lambda b: jnp.sum(b**2), x, 4))
    >>> total(jnp.arange(10.0))   # batches of 4, 4 and 2
    Array(285., dtype=float32)
"""

from linops.runtime._batching import batched_map, batched_sum
from linops.runtime._compile import program
from linops.runtime._conv_layout import canonical_convolutions, has_conv
from linops.runtime._draws import flat_draw
from linops.runtime._progress import new_bar, tick, update

__all__ = [
    "batched_map", "batched_sum", "canonical_convolutions", "flat_draw", "has_conv", "new_bar", "program", "tick",
    "update",
]
