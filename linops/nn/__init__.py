"""Operators made from a network: its Jacobian, GGN, loss Jacobian, KFAC factors, likelihoods, model
adapters, and alternating projections over the row blocks of its Jacobian.

Everything here is built on the algebra of `linops` and re-exported there (``lo.GGNOp`` is
``linops.nn.GGNOp``); the algebra never imports this package.

Examples:
    >>> import linops as lo
    >>> from linops.nn import GGNOp, likelihoods
    >>> lo.GGNOp is GGNOp, lo.likelihoods.Gaussian is likelihoods.Gaussian
    (True, True)
"""

from linops.nn import layers, likelihoods, models
from linops.nn._alternating import AlternatingProjectionOp, Projection
from linops.nn._kfac import KFAC, FoundLayer, find_layers, kfac
from linops.nn._operators import GGNOp, JacobianOp, LossJacobianOp
from linops.nn._streaming import StreamingGGNOp

__all__ = ["AlternatingProjectionOp", "FoundLayer", "GGNOp", "JacobianOp", "KFAC", "LossJacobianOp", "Projection",
           "StreamingGGNOp", "find_layers", "kfac", "layers", "likelihoods", "models"]
