"""Likelihoods: the module `linops.nn.likelihoods` under its public name ``linops.likelihoods``.

Examples:
    >>> import linops.likelihoods, linops.nn.likelihoods
    >>> linops.likelihoods.__all__ == linops.nn.likelihoods.__all__
    True
"""

from linops.nn.likelihoods import *  # noqa: F403
from linops.nn.likelihoods import __all__  # noqa: F401
