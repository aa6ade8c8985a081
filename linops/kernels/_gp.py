r"""Gaussian-process marginal likelihood, exactly, and fitting a kernel's hyperparameters to it."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops.algebra import _tags
from linops.algebra._functions import factorize, logdet, solve, sqrt
from linops.algebra._leaves import Dense
from linops.kernels._base import Kernel, _check_inputs, _outputs, _positive
from linops.kernels._multioutput import Coregionalized
from linops.memory import check_fits
from linops.runtime._compile import program
from linops.runtime._progress import tick


class GPFit(eqx.Module):
    """The result of `fit_gp`: the fitted kernel and noise, and the optimisation's trace.

    Attributes:
        kernel: the kernel at the last step.
        noise_variance: the Gaussian noise variance at the last step.
        log_marginal_likelihood: per step, the exact log marginal likelihood of the (sub)set.
        num_points: how many points the likelihood used.
    """

    kernel: Kernel
    noise_variance: jax.Array
    log_marginal_likelihood: jax.Array
    num_points: int = eqx.field(static=True)


def _check_targets(kernel, X, y, who):
    """``y`` as an array of shape ``(n,)`` (one output) or ``(n, O)`` (``O`` outputs)."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"{who}: kernel must be a linops.kernels.Kernel, got {type(kernel).__name__}")
    y = jnp.asarray(y)
    n, n_out = X.shape[0], kernel.num_outputs
    expected = (n,) if n_out == 1 else (n, n_out)
    if y.shape != expected:
        per = "" if n_out == 1 else " (examples x outputs)"
        raise ValueError(f"{who}: y must have shape {expected}{per} for a kernel with {_outputs(n_out)} and {n} "
                         f"inputs, got {y.shape}")
    return y


def _noise_diagonal(noise_variance, n, n_out, who):
    """The noise variances along the example-major diagonal, ``(n·O,)``."""
    noise = jnp.asarray(noise_variance)
    if noise.ndim == 0:
        return jnp.broadcast_to(noise, (n * n_out,))
    if noise.shape == (n_out,):
        return jnp.tile(noise, n)
    raise ValueError(f"{who}: noise_variance must be a scalar or one variance per output, shape ({n_out},), "
                     f"got shape {noise.shape}")


def gp_log_marginal_likelihood(kernel: Kernel, X, y, noise_variance) -> jax.Array:
    r"""$\log \mathcal N(y \mid 0, K + \sigma^2 I)$, exactly (a Cholesky of the ``nO x nO`` Gram).

    Args:
        kernel: the prior covariance, with $O$ = ``kernel.num_outputs`` outputs.
        X: inputs, ``(n, d)``.
        y: targets, ``(n,)`` for a single-output kernel and ``(n, O)`` for a multi-output one
            (compared, example-major, with the ``(nO, nO)`` Gram).
        noise_variance: $\sigma^2$, a scalar or one variance per output, ``(O,)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from linops.kernels import White, gp_log_marginal_likelihood
        >>> # K + noise = 2 I: two independent N(0, 2) terms
        >>> round(float(gp_log_marginal_likelihood(White(1.0), jnp.zeros((2, 1)), jnp.zeros(2), 1.0)), 4)
        -2.531
    """
    who = "gp_log_marginal_likelihood"
    X = _check_inputs(X, who)
    y = _check_targets(kernel, X, y, who).reshape(-1)
    N = y.shape[0]
    noise = _noise_diagonal(noise_variance, X.shape[0], kernel.num_outputs, who)
    check_fits(N * N * np.dtype(jnp.result_type(X.dtype, float)).itemsize, f"the exact GP likelihood of {N} values",
               "fit on a subset (fit_gp(..., max_points=m, key=key))")
    G = factorize(Dense(kernel(X) + jnp.diag(noise.astype(X.dtype)), tags={_tags.psd}))  # one Cholesky
    return -0.5 * (y @ solve(G, y).value + logdet(G) + N * jnp.log(2 * jnp.pi))


class _SquareRoot(eqx.Module):
    """An output covariance during `fit_gp`, held as an unconstrained factor ``S`` with ``B = S Sᵀ``."""

    factor: jax.Array


def _is_square_root(x):
    return isinstance(x, _SquareRoot)


def _factor_output_covariances(tree):
    """Replace each `Coregionalized`'s ``B`` by its symmetric square root (``B`` is PSD: checked at construction)."""

    def factor(node):
        if not isinstance(node, Coregionalized):
            return node
        root = sqrt(Dense(node.output_covariance, tags={_tags.psd})).as_matrix()  # the principal root, by eigh
        return eqx.tree_at(lambda c: c.output_covariance, node, _SquareRoot(root))

    return jax.tree_util.tree_map(factor, tree, is_leaf=lambda x: isinstance(x, Coregionalized))


def _multiply_output_covariances(tree):
    def multiply(node):
        if not _is_square_root(node):
            return node
        B = node.factor @ node.factor.T
        return 0.5 * (B + B.T)

    return jax.tree_util.tree_map(multiply, tree, is_leaf=_is_square_root)


def _unpack(variables, params, fixed, static, noise, fit_noise):
    """``(kernel, noise)`` from the optimised variables (logarithms, square-root factors)."""
    logs, roots = variables
    values = jax.tree_util.tree_map(lambda lg, a, f: jnp.where(f, a, jnp.exp(lg)), logs, params, fixed)
    kern, noise_ = _multiply_output_covariances(eqx.combine(values, roots, static, is_leaf=_is_square_root))
    return kern, (noise_ if fit_noise else noise)


@program
def _fit_gp_program(variables, params, fixed, static, X, y, noise, learning_rate, num_steps, fit_noise, progress=None):
    """Adam's ``num_steps`` steps as one program, compiled once per kernel structure, shapes and step count."""
    import optax

    def loss(variables):
        kern, noise_ = _unpack(variables, params, fixed, static, noise, fit_noise)
        return -gp_log_marginal_likelihood(kern, X, y, noise_)

    opt = optax.adam(learning_rate)

    def step(state, i):
        variables, opt_state = state
        value, grad = jax.value_and_grad(loss)(variables)
        updates, opt_state = opt.update(grad, opt_state, variables)
        note = (lambda v: f"log marginal likelihood {float(v):.6g}", (-value,))
        tick(progress, i + 1, num_steps, unit="step", note=note)
        return (optax.apply_updates(variables, updates), opt_state), -value

    (variables, _), history = lax.scan(step, (variables, opt.init(variables)), jnp.arange(num_steps))
    return variables, history


def fit_gp(kernel: Kernel, X, y, *, noise_variance=0.1, num_steps: int = 200, learning_rate: float = 0.05,
           max_points: int | None = None, key: jax.Array | None = None, fit_noise: bool = True,
           progress: bool = True) -> GPFit:
    r"""Maximise the exact GP marginal likelihood over the kernel's hyperparameters (and the noise).

    Adam (optax) on the logarithms of every positive hyperparameter, so they stay positive;
    hyperparameters that are exactly zero (a `Linear` bias of 0) stay fixed. A `Coregionalized`
    output covariance $B$ is fitted too, as $B = S S^\top$ with an unconstrained $S$ started at
    $B^{1/2}$, so it stays symmetric PSD. With ``max_points`` the likelihood uses a random subset
    of that many examples (drawn with ``key``), as FSP-Laplace does to set its prior. Returns a
    `GPFit` with the per-step likelihood.

    Args:
        kernel: the starting kernel.
        X: inputs, ``(n, d)``.
        y: targets, ``(n,)``, or ``(n, O)`` for a kernel with ``O`` outputs.
        noise_variance: the starting noise variance, a scalar or one per output ``(O,)``.
        num_steps: Adam steps.
        learning_rate: Adam's step size (on the logarithms).
        max_points: fit on a random subset of this many examples (needs ``key``).
        key: the PRNG key for the subset.
        fit_noise: whether to fit the noise variance too.
        progress: a progress bar over Adam's steps on stderr (with the log marginal likelihood), shown
            once the fit runs longer than two seconds; False silences it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from linops.kernels import RBF, fit_gp
        >>> X = jnp.linspace(-3, 3, 40)[:, None]
        >>> y = jnp.sin(2 * X[:, 0])
        >>> fit = fit_gp(RBF(lengthscale=3.0), X, y, noise_variance=0.1, num_steps=100)
        >>> bool(fit.log_marginal_likelihood[-1] > fit.log_marginal_likelihood[0])
        True
    """
    X = _check_inputs(X, "fit_gp")
    y = _check_targets(kernel, X, y, "fit_gp")
    kernel.check_inputs(X)
    if max_points is not None and X.shape[0] > max_points:
        if key is None:
            raise ValueError(f"fit_gp: a subset of {max_points} of the {X.shape[0]} points needs a PRNG key")
        idx = jax.random.choice(key, X.shape[0], (max_points,), replace=False)
        X, y = X[idx], y[idx]
    noise = _positive("noise_variance", "fit_gp", noise_variance)
    _noise_diagonal(noise, X.shape[0], kernel.num_outputs, "fit_gp")  # the shape check, early
    tree = _factor_output_covariances((kernel, noise))
    roots, rest = eqx.partition(tree, _is_square_root, is_leaf=_is_square_root)
    params, static = eqx.partition(rest, eqx.is_inexact_array)
    fixed = jax.tree_util.tree_map(lambda a: a <= 0, params)
    logs = jax.tree_util.tree_map(lambda a, f: jnp.log(jnp.where(f, 1.0, a)), params, fixed)

    variables, history = _fit_gp_program((logs, roots), params, fixed, static, X, y, noise,
                                         jnp.asarray(learning_rate, jnp.result_type(float)), int(num_steps),
                                         bool(fit_noise), "fit_gp" if progress else None)
    kern, noise_ = _unpack(variables, params, fixed, static, noise, fit_noise)
    return GPFit(kern, noise_, history, int(X.shape[0]))
