"""linops: lazy, matrix-free, structure-aware linear operators in JAX.

Examples:
    >>> import jax.numpy as jnp, linops as lo
    >>> J = lo.Dense(jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]))
    >>> G = J.T @ lo.Diagonal(jnp.array([2.0, 3.0])) @ J      # lazy, tagged PSD
    >>> sorted(G.tags)
    ['psd', 'symmetric']
    >>> lo.solve(lo.shift(G, 1.0), jnp.ones(3), method="cg").converged
    Array(True, dtype=bool)
"""

from linops import (
    closed_forms,
    kernels,
    likelihoods,
    memory,
    models,
    nn,
    tags,
)
from linops.algebra import _woodbury  # noqa: F401  (registers the Woodbury closed forms of sums)
from linops.algebra._base import LinearOperator
from linops.algebra._circulant import Circulant
from linops.algebra._composite import Scaled, Sum
from linops.algebra._depth import ExpressionTooDeepError, max_nesting, nesting_depth
from linops.algebra._eigen import EigenDecomposed
from linops.algebra._estimates import Estimate, hutchinson
from linops.algebra._factorizations import LU, Cholesky, Triangular
from linops.algebra._functions import (
    diag,
    eigendecompose,
    eigh,
    eigvalsh,
    factorize,
    inv,
    logdet,
    pinv,
    root,
    shift,
    solve,
    sqrt,
    trace,
)
from linops.algebra._leaves import Dense, Diagonal, FunctionOp, Identity, Zero
from linops.algebra._lower import Lowered, count_matmuls, explain, lower
from linops.algebra._lowrank import AbstractLowRank, LowRank
from linops.algebra._products import Inverse, Product, Transpose
from linops.algebra._projector import Complement, ProjectorOp
from linops.algebra._rules import RULES, NoReduction, Rule, simplify
from linops.algebra._sharding import sharded_mm
from linops.algebra._solvers import Solution
from linops.algebra._spectral import svd
from linops.algebra._structured import BlockDiagonal, Kronecker, Selection
from linops.interop._lineax import LineaxOp, from_lineax, to_lineax
from linops.kernels import KernelGramOp
from linops.nn import (  # the network operators, re-exported: lo.GGNOp is linops.nn.GGNOp
    KFAC,
    AlternatingProjectionOp,
    GGNOp,
    HessianOp,
    JacobianOp,
    LossJacobianOp,
    Projection,
    StreamingGGNOp,
    kfac,
)
from linops.numerics import _slq  # noqa: F401  (registers logdet(method="slq"))
from linops.numerics._lanczos import Lanczos, LanczosLowRankOp, lanczos
from linops.numerics._sketched import Sketch, SketchedEigenbasis, SketchedLanczos, sketch, sketched_lanczos

__version__ = "0.1.0"

__all__ = [
    "AbstractLowRank", "AlternatingProjectionOp", "BlockDiagonal", "Cholesky", "Circulant", "closed_forms",
    "Complement", "count_matmuls", "Dense", "diag",
    "Diagonal", "eigendecompose", "EigenDecomposed", "eigh", "eigvalsh", "Estimate", "factorize", "LU", "root",
    "Triangular",
    "explain", "ExpressionTooDeepError", "from_lineax", "FunctionOp", "GGNOp", "HessianOp", "hutchinson", "Identity",
    "inv", "Inverse",
    "JacobianOp", "kernels", "KernelGramOp", "KFAC", "kfac", "Kronecker", "Lanczos", "lanczos", "LanczosLowRankOp",
    "likelihoods", "LinearOperator", "LineaxOp", "logdet",
    "LossJacobianOp", "lower", "Lowered", "LowRank", "max_nesting", "memory", "models", "nesting_depth", "nn",
    "NoReduction", "pinv",
    "Product", "Projection", "ProjectorOp", "Rule", "RULES", "Scaled", "Selection", "sharded_mm", "shift", "simplify",
    "Sketch", "sketch", "SketchedEigenbasis", "SketchedLanczos", "sketched_lanczos",
    "Solution", "solve", "sqrt", "svd", "StreamingGGNOp", "Sum", "tags", "to_lineax", "trace", "Transpose", "Zero",
]


def __getattr__(name):
    # `linops.testing` is imported on first use so that `import linops` stays light.
    if name == "testing":
        import importlib

        return importlib.import_module("linops.testing")
    raise AttributeError(f"module 'linops' has no attribute {name!r}")
