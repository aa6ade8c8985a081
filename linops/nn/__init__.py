"""Operators made from a network: its Jacobian, GGN, Hessian, loss Jacobian, KFAC factors, the layers found in its
program, and alternating projections over the row blocks of its Jacobian. The model adapters
(`linops.models`) and the likelihoods (`linops.likelihoods`) they take are modules of `linops` itself.

Everything here is built on the algebra of `linops` and re-exported there (``lo.GGNOp`` is
``linops.nn.GGNOp``); the algebra never imports this package.

Examples:
    >>> import linops as lo
    >>> from linops.nn import GGNOp
    >>> lo.GGNOp is GGNOp
    True
"""

from linops.nn import layers
from linops.nn._alternating import AlternatingProjectionOp, Projection
from linops.nn._hessian import HessianOp
from linops.nn._kfac import KFAC, FoundLayer, find_layers, kfac
from linops.nn._operators import GGNOp, JacobianOp, LossJacobianOp
from linops.nn._streaming import StreamingGGNOp

__all__ = ["AlternatingProjectionOp", "FoundLayer", "GGNOp", "HessianOp", "JacobianOp", "KFAC", "LossJacobianOp",
           "Projection", "StreamingGGNOp", "find_layers", "kfac", "layers"]
