r"""Likelihoods: per-example loss $\ell(f, y) = -\log p(y \mid f)$, its output-space gradient and Hessian.

Each likelihood works on ONE example's network output ``f`` of shape ``(O,)``:

- `nll(f, y)`: the negative log-likelihood (with its normalising constant);
- `grad(f, y)`: $\partial \ell / \partial f$, shape ``(O,)``;
- `hvp(f, y, u)`: $H u$ with $H = \partial^2 \ell / \partial f^2$ (closed forms, no autodiff);
- `hessian(f, y)`: $H$ as a PSD operator (``O x O``);
- `hessian_factor(f, y)`: a ``(K, O)`` matrix $A$ with $A^\top A = H$ (a square root of $H$; ``K`` is
  `factor_rows`, ``O`` for the likelihoods themselves);
- `sample(key, f, n)`: ``n`` targets drawn from $p(y \mid f)$.

Other curvatures than the GGN are likelihoods too: `EmpiricalFisher` and `MonteCarloFisher` wrap a
likelihood and replace its output Hessian by $g g^\top$ ($g = \partial\ell/\partial f$ at the observed
target) or by its average over targets sampled from the model. Every operator and rule that takes a
likelihood (`linops.GGNOp`, its exact diagonal, `linops.kfac`) then computes that curvature.

Outputs with a position axis (a sequence model's ``(T, V)`` logits) are read flattened: `PerPosition` is a
likelihood at every position, summed, and `Flattened` the model whose output it reads (`with_positions` wraps a
likelihood, or a curvature's base, for a shape).

Closed forms: Gaussian $I/\sigma^2$; categorical $\operatorname{diag}(p) - p p^\top$ with
$p = \operatorname{softmax}(f)$; Bernoulli $\operatorname{diag}(p (1 - p))$ with $p = \sigma(f)$; a heteroscedastic
Gaussian (the network predicts mean and log-variance) its Fisher $\operatorname{diag}(e^{-s}, \tfrac12)$.

Examples:
    >>> import jax.numpy as jnp
    >>> from linops.likelihoods import Categorical
    >>> Categorical().hvp(jnp.zeros(2), jnp.asarray(0), jnp.array([1.0, 0.0]))
    Array([ 0.25, -0.25], dtype=float32)
"""

from linops.likelihoods._base import (
    Bernoulli,
    Categorical,
    EmpiricalFisher,
    Gaussian,
    HeteroscedasticGaussian,
    Likelihood,
    MonteCarloFisher,
)
from linops.likelihoods._positions import Flattened, PerPosition, with_positions

__all__ = ["Bernoulli", "Categorical", "EmpiricalFisher", "Flattened", "Gaussian", "HeteroscedasticGaussian",
           "Likelihood", "MonteCarloFisher", "PerPosition", "with_positions"]

for _cls in (Bernoulli, Categorical, EmpiricalFisher, Flattened, Gaussian, HeteroscedasticGaussian, Likelihood,
             MonteCarloFisher, PerPosition):
    _cls.__module__ = __name__  # their public home in messages and reprs: linops.likelihoods.Gaussian
del _cls
