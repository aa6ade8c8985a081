r"""Covariance kernels and `KernelGramOp`, their Gram matrices as lazy operators.

A kernel is an `equinox.Module` whose hyperparameters are array leaves, so ``jax.grad`` (or
``eqx.filter_grad``) differentiates through them. Kernels add (``k1 + k2``), multiply
(``k1 * k2``) and scale (``2.0 * k``). ``k(X)`` and ``k(X, Y)`` give small dense Gram matrices;
`KernelGramOp` gives the same matrix as an operator evaluated tile by tile, never holding the
``n x m`` matrix.

Inputs are 2-D, ``(n, d)``. Stationary kernels use the scaled distance
$r = \|(x - y) / \ell\|$ with a scalar or per-dimension (ARD) lengthscale $\ell$.

Multi-output kernels (`Independent`, `Coregionalized` and their sums) have `num_outputs` $O > 1$
and give $\mathrm{cov}(f_o(x_i), f_{o'}(y_j))$; their Gram matrices are $(nO) \times (mO)$ in
example-major order (row $iO + o$ is output $o$ of example $i$, as in `JacobianOp`).

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.kernels import RBF, White
    >>> k = RBF(lengthscale=1.0) + White(0.1)
    >>> G = k(jnp.array([[0.0], [1.0]]))
    >>> [[round(float(g), 4) for g in row] for row in G]   # exp(-1/2) off the diagonal
    [[1.1, 0.6065], [0.6065, 1.1]]
"""

from linops.kernels._base import Kernel, ProductKernel, ScaledKernel, SumKernel
from linops.kernels._basic import Linear, Periodic, White
from linops.kernels._gp import GPFit, fit_gp, gp_log_marginal_likelihood
from linops.kernels._gram import KernelGramOp
from linops.kernels._multioutput import Coregionalized, Independent
from linops.kernels._stationary import RBF, Matern12, Matern32, Matern52, RationalQuadratic, Stationary

__all__ = [
    "Coregionalized", "fit_gp", "gp_log_marginal_likelihood", "GPFit", "Independent", "Kernel", "KernelGramOp",
    "Linear", "Matern12", "Matern32", "Matern52", "Periodic", "ProductKernel", "RationalQuadratic", "RBF",
    "ScaledKernel", "Stationary", "SumKernel", "White",
]
