"""Model adapters: the module `linops.nn.models` under its public name ``linops.models``.

Examples:
    >>> import linops.models, linops.nn.models
    >>> linops.models.__all__ == linops.nn.models.__all__
    True
"""

from linops.nn.models import *  # noqa: F403
from linops.nn.models import __all__  # noqa: F401
