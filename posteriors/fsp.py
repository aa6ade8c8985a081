r"""FSP-Laplace: a Gaussian-process prior on the network's function (Cinquin et al., NeurIPS 2024).

Training (algorithm 1) minimises the negative log-likelihood plus the RKHS norm of
$f(\cdot, w) - \mu$ estimated at context points drawn afresh at every step
(`fsp_objective`). The Laplace step (algorithm 2, `fsp_laplace`) approximates the posterior
precision $J(C)^\top K_{CC}^{+} J(C) + G$ without forming any ``P x P``, ``P x n_C`` or
``n_C x n_C`` matrix:

1. Lanczos on $K_{CC}$ (matrix-free, `linops.KernelGramOp`) started at $J(C)\mathbf 1$,
   giving $L$ with $L L^\top \approx K_{CC}^{+}$ (restarted on an invariant Krylov space:
   context points far apart relative to the lengthscale make $K_{CC} \approx cI$, whose
   Krylov space from one vector is one-dimensional);
2. $M = J(C)^\top L$ by VJPs; 3. a thin SVD $M = U_M D_M V_M^\top$;
4. $A = D_M^2 + U_M^\top G U_M$ by GGN products; 5. $A = U_A D_A U_A^\top$;
6. covariance $U_M U_A D_A^{+} U_A^\top U_M^\top$, after truncating the smallest eigenvalues
   of $D_A$ until the posterior variance is at most the prior variance at every context point.

Inputs may have any shape ``(n, ...)`` (images for a convolutional network): the network sees each
input as given, the kernel and the prior mean see it flattened to a row of ``d`` numbers.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> import posteriors as pst
    >>> from linops.kernels import RBF
    >>> from linops.likelihoods import Gaussian
    >>> fn = lambda w, x: jnp.tanh(x @ w[:2] + w[2:3])        # a one-unit "network"
    >>> X = jnp.array([[0.0, 1.0], [1.0, 0.0]]); Y = jnp.array([[0.5], [-0.5]])
    >>> C = jnp.array([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.5], [0.5, -1.0]])
    >>> post = pst.fsp_laplace(fn, jnp.array([0.3, -0.2, 0.1]), (X, Y), RBF(), C, likelihood=Gaussian(0.1))
    >>> mean, var = post.predictive(C)
    >>> bool(jnp.all(var <= RBF().diag(C)[:, None] * (1 + 1e-5)))   # posterior variance <= prior variance
    True
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.kernels import Independent, Kernel
from linops.likelihoods import Likelihood
from linops.models import ravel
from linops.runtime import batched_map, program, tick
from posteriors._checks import check_data, check_finite, check_likelihood, check_params
from posteriors._training import positive_int
from posteriors.gaussian import AbstractLowRankPosterior


class GPPrior(eqx.Module):
    r"""A Gaussian-process prior $\mathcal{GP}(\mu, k)$ on the network function: ``GPPrior(kernel, mean=None)``.

    Attributes:
        kernel: a `linops.kernels.Kernel`. A single-output kernel is shared by all $O$
            outputs, independently; a multi-output kernel must have $O$ outputs.
        mean: the prior mean $\mu(x) \in \mathbb R^O$ of ONE input (default zero).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.fsp import GPPrior
        >>> from linops.kernels import Matern52
        >>> prior = GPPrior(Matern52(lengthscale=0.5), mean=lambda x: jnp.array([1.0]))
        >>> prior.mean_at(jnp.zeros((2, 1)), 1)
        Array([[1.],
               [1.]], dtype=float32)
    """

    kernel: Kernel
    mean: Callable | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if not isinstance(self.kernel, Kernel):
            raise TypeError(f"GPPrior: kernel must be a linops.kernels.Kernel, got {type(self.kernel).__name__}")
        if self.mean is not None and not callable(self.mean):
            raise TypeError(f"GPPrior: mean must be a function x -> (O,) or None, got {type(self.mean).__name__}")

    def kernel_for(self, num_outputs: int, who: str = "GPPrior") -> Kernel:
        """The kernel over ``num_outputs`` outputs (a shared single-output kernel made `Independent`)."""
        k = self.kernel
        if k.num_outputs == num_outputs:
            return k
        if k.num_outputs == 1:
            return Independent(k, num_outputs=num_outputs)
        raise ValueError(f"{who}: the prior kernel has {k.num_outputs} outputs but the network has {num_outputs}")

    def mean_at(self, X, num_outputs: int) -> jax.Array:
        """$\\mu$ at each input of ``X`` (flattened to a row), shape ``(n, O)``."""
        X = _rows(X)
        if self.mean is None:
            return jnp.zeros((X.shape[0], num_outputs), X.dtype)
        mu = jax.vmap(self.mean)(X)
        if mu.shape != (X.shape[0], num_outputs):
            raise ValueError(f"GPPrior: mean(x) must return shape ({num_outputs},), got {mu.shape[1:]}")
        return mu

    def variance_at(self, X, num_outputs: int) -> jax.Array:
        """The prior variance $k(x, x)$ of each output, shape ``(n, O)``, each input flattened to a row."""
        X = _rows(X)
        return self.kernel_for(num_outputs).diag(X).reshape(X.shape[0], num_outputs)


def _as_prior(prior, who) -> GPPrior:
    if isinstance(prior, GPPrior):
        return prior
    if isinstance(prior, Kernel):
        return GPPrior(prior)
    raise TypeError(f"{who}: prior must be a GPPrior or a linops.kernels.Kernel, got {type(prior).__name__}")


def _rows(X) -> jax.Array:
    """Inputs ``(n, ...)`` as the rows ``(n, d)`` a kernel and a prior mean see."""
    X = jnp.asarray(X)
    return X.reshape(X.shape[0], -1)


def _outputs(fn, params, X, who):
    X = jnp.asarray(X)
    if X.ndim < 2 or X.shape[0] == 0:
        raise ValueError(f"{who}: inputs must be (n, d) or (n, ...) with n >= 1 (one input per row), got shape "
                         f"{X.shape}")
    try:
        out = jax.eval_shape(fn, params, X[0])
    except Exception as e:  # noqa: BLE001 - any failure means params/inputs do not fit fn
        raise ValueError(f"{who}: fn(params, x) fails on the first input (do params match the model?): {e}") from None
    if len(out.shape) != 1:
        raise ValueError(f"{who}: fn(params, x) must return one example's outputs of shape (O,), got {out.shape}")
    return out.shape[0]


def rkhs_norm(fn, params, prior, context_points, *, jitter: float = 1e-4) -> jax.Array:
    r"""The RKHS term $\tfrac12 r^\top (K_{CC} + \epsilon I)^{-1} r$ with $r = f(C) - \mu(C)$.

    It estimates $\tfrac12\|f - \mu\|^2_{\mathbb H}$ from below (the minimum-norm interpolant at $C$).

    ``jitter`` is RELATIVE: $\epsilon$ is ``jitter`` times the mean prior variance at the
    context points, as if the prior had white noise of that variance. It is a modelling
    choice more than a numerical one: a smooth or periodic kernel's Gram is numerically low
    rank, and a jitter near the dtype's rounding level makes every component of $f(C)$ outside
    its span cost $\|r_\perp\|^2/\epsilon$, which training then struggles with (the FSP-Laplace page of
    the docs, "Relative jitter in training", has the measurement). The default does not depend on the
    dtype. A Cholesky of the dense ``(n_C O) x (n_C O)`` Gram: keep the number of training context points
    modest.

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.fsp import rkhs_norm
        >>> from linops.kernels import White
        >>> fn = lambda w, x: w * jnp.ones(1)                     # the constant function w
        >>> float(rkhs_norm(fn, jnp.array(2.0), White(4.0), jnp.zeros((3, 1)), jitter=0.0))   # 3 * 2^2 / 4 / 2
        1.5
    """
    prior = _as_prior(prior, "rkhs_norm")
    C = jnp.asarray(context_points)
    num_outputs = _outputs(fn, params, C, "rkhs_norm")
    kernel = prior.kernel_for(num_outputs, "rkhs_norm")
    resid = (jax.vmap(fn, in_axes=(None, 0))(params, C) - prior.mean_at(C, num_outputs)).reshape(-1)
    K = kernel(_rows(C)).astype(resid.dtype)
    eps = jitter * jnp.mean(jnp.diag(K))
    K = lo.Dense(K + eps * jnp.eye(K.shape[0], dtype=K.dtype), tags={"psd"})
    return 0.5 * resid @ lo.solve(K, resid).value  # by Cholesky


def fsp_objective(fn, prior, likelihood: Likelihood, *, num_data: int, context, jitter: float = 1e-4):
    r"""The FSP-Laplace training objective (algorithm 1), as a function for `jax.grad` and optax.

    Returns ``objective(params, batch, key=None)`` with ``batch = (inputs, targets)`` of
    size $b$:

    $$R(w) = \frac{N}{b}\sum_{(x, y) \in \text{batch}} \ell(f(x, w), y) + \tfrac12
    (f(C, w) - \mu(C))^\top K_{CC}^{-1} (f(C, w) - \mu(C)),$$

    with context points ``C = context(key)`` drawn afresh at each call (``context`` a
    function of a PRNG key, e.g. ``lambda key: pst.context.uniform(key, X, 100)``), or a fixed
    ``(n_C, d)`` array. $R$ has the scale of a full-data negative log posterior; divide
    by $N$ for learning rates tuned per example.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        prior: a `GPPrior` or a `linops.kernels.Kernel` (zero mean).
        likelihood: a `linops.likelihoods.Likelihood` (not a per-example one).
        num_data: $N$, the size of the training set.
        context: ``key -> (n_C, d)`` (or ``(n_C, ...)``, the inputs' shape) context points, or a fixed array
            of them.
        jitter: relative jitter of the Gram's Cholesky (see `rkhs_norm`).

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> import posteriors as pst
        >>> from linops.kernels import RBF
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.linspace(-1, 1, 8)[:, None]; Y = jnp.sin(3 * X)
        >>> fn = lambda w, x: jnp.tanh(x @ w["a"]) @ w["b"]
        >>> w = {"a": jnp.ones((1, 8)), "b": jnp.zeros((8, 1))}
        >>> loss = pst.fsp_objective(fn, RBF(0.5), Gaussian(0.1), num_data=8,
        ...                          context=lambda key: pst.context.uniform(key, X, 16))
        >>> opt = optax.adam(1e-2); state = opt.init(w)
        >>> @jax.jit  # one compiled step: an eager `jax.grad` would dispatch every operation of the loss
        ... def step(w, state, key):
        ...     updates, state = opt.update(jax.grad(loss)(w, (X, Y), key), state)
        ...     return optax.apply_updates(w, updates), state
        >>> before = loss(w, (X, Y), jax.random.key(0))
        >>> for i in range(100):
        ...     w, state = step(w, state, jax.random.key(i))
        >>> bool(loss(w, (X, Y), jax.random.key(0)) < before)
        True
    """
    prior = _as_prior(prior, "fsp_objective")
    check_likelihood(likelihood, "fsp_objective")
    if likelihood.per_example:
        raise ValueError("fsp_objective: a per-example (heteroscedastic) likelihood cannot follow random "
                         "mini-batches; use a likelihood with shared parameters")
    if not isinstance(num_data, (int, np.integer)) or num_data < 1:
        raise ValueError(f"fsp_objective: num_data must be a positive integer, got {num_data!r}")
    if not callable(context):
        fixed = jnp.asarray(context)
        if fixed.ndim < 2:
            raise ValueError(f"fsp_objective: context must be a function of a key or an (n_C, ...) array, "
                             f"got shape {fixed.shape}")

    def objective(params, batch, key=None):
        X, Y = check_data(batch, "fsp_objective", "batch")
        if callable(context):
            if key is None:
                raise ValueError("fsp_objective: the context points are drawn afresh at each step: pass key=...")
            C = context(key)
        else:
            C = fixed
        out = jax.vmap(fn, in_axes=(None, 0))(params, X)
        nll = jnp.sum(jax.vmap(likelihood.nll)(out, Y))
        return nll * (num_data / X.shape[0]) + rkhs_norm(fn, params, prior, C, jitter=jitter)

    return objective


class FSPInfo(eqx.Module):
    """What `fsp_laplace` did, as values.

    Attributes:
        lanczos_steps: Lanczos steps run on $K_{CC}$.
        lanczos_restarts: how often Lanczos left an invariant Krylov space for a new direction.
        rank: columns of $M = J(C)^\\top L$ above the relative cut-off.
        truncated: eigenvalues of $A$ removed so that the posterior variance stays below
            the prior variance at every context point.
        max_variance_ratio: the largest posterior / prior variance over the context points.
    """

    lanczos_steps: jax.Array
    lanczos_restarts: jax.Array
    rank: jax.Array
    truncated: jax.Array
    max_variance_ratio: jax.Array


class FSPLaplacePosterior(AbstractLowRankPosterior):
    r"""The FSP-Laplace posterior $\mathcal N(w^*, U \operatorname{diag}(d) U^\top)$ (orthonormal ``U``).

    A low-rank posterior (``.mean``, ``.covariance``, ``.sample``, exact linearised
    ``.predictive``) that also keeps its `GPPrior` (``prior_mean``, ``prior_variance``) and
    what the construction did (``info``, an `FSPInfo`).
    """

    U: jax.Array
    d: jax.Array
    prior: GPPrior
    info: FSPInfo
    batch_size: int | None = eqx.field(static=True)
    orthonormal: bool = eqx.field(static=True, default=True)

    def __init__(self, fn, params, U, d, prior, info, *, batch_size=None):
        self.fn, self.params, self.unravel = fn, params, ravel(params)[1]
        self.U, self.d, self.batch_size = jnp.asarray(U), jnp.asarray(d), batch_size
        self.prior, self.info = prior, info

    def prior_mean(self, inputs) -> jax.Array:
        """The prior mean at ``inputs``, shape ``(M, O)``."""
        return self.prior.mean_at(inputs, self.map_outputs(inputs[:1]).shape[1])

    def prior_variance(self, inputs) -> jax.Array:
        """The prior variance at ``inputs``, shape ``(M, O)``."""
        return self.prior.variance_at(inputs, self.map_outputs(inputs[:1]).shape[1])


_BUDGET = 1 << 25  # numbers a product with many columns holds at once: examples x columns x one example's activations
_COLUMNS = 16  # columns per block a default batch size leaves room for


def _activations(fn, params, x) -> int:
    """The numbers one example's forward pass computes (the outputs of every operation of ``fn``'s program,
    nested programs included): what a JVP or a VJP of a batch holds per example and column."""
    def count(jaxpr):
        own = sum(int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars
                  if hasattr(v.aval, "shape"))
        return own + sum(count(sub) for sub in jex.core.subjaxprs(jaxpr))

    return max(1, count(jax.make_jaxpr(lambda x: fn(params, x))(x).jaxpr))


def _plan(num_examples: int, batch_size: int | None, activations: int, num_params: int,
          columns: int) -> tuple[int, int]:
    """``(examples per batch, columns per block)`` of a product with ``columns`` columns. A block's columns hold
    the batch's activations and three parameter-length vectors each (the tangent, the batch's product, the
    running sum): at most `_BUDGET` numbers or as many as the ``(P, rank)`` factors the algorithm keeps anyway,
    whichever is more. A default batch (None) leaves room for `_COLUMNS` columns: each block repeats the
    batch's forward pass, so blocks of one column repeat it for every column."""
    if batch_size is None:
        batch_size = min(num_examples, max(1, _BUDGET // (activations * min(columns, _COLUMNS))))
    budget = max(_BUDGET, num_params * columns)
    return int(batch_size), int(min(columns, max(1, budget // (batch_size * activations + 3 * num_params))))


def _products_plan(fn, params, X, C, rank: int, batch_size, context_batch_size) -> tuple[int, int, int, int]:
    """`_algorithm2`'s plan: ``(examples per GGN batch, GGN columns per block, context points per Jacobian
    batch, Jacobian columns per block)`` for products with ``rank`` columns (`_plan`)."""
    act, P = _activations(fn, params, C[0]), int(ravel(params)[0].shape[0])
    return (*_plan(X.shape[0], batch_size, act, P, rank), *_plan(C.shape[0], context_batch_size, act, P, rank))


def _by_columns(apply, V, block: int):
    """``apply(V)``, ``block`` columns of ``V`` at a time (`linops.runtime.batched_map` over its columns)."""
    if block >= V.shape[1]:
        return apply(V)
    return batched_map(lambda rows: apply(rows.T).T, V.T, block).T


def _cutoff(values, rtol):
    """``values > rtol * max|values|`` (a relative cut-off)."""
    return values > rtol * jnp.max(jnp.abs(values))


@program
def _algorithm2(fn, params, X, Y, C, kernel, likelihood, num_steps, plan, rtol, mesh=None, progress=None):
    # plan: from `_products_plan`. The products with the rank columns run in blocks of columns: all at once,
    # they held a batch's activations per column (LeNet-5, 256 images, rank 500: 67 GB; planned: 1.5 GB)
    batch_size, columns, context_batch_size, context_columns = plan
    flat, _ = ravel(params)
    dtype = flat.dtype
    eps = float(np.finfo(dtype).eps)
    J = lo.JacobianOp(fn, params, C, batch_size=context_batch_size, mesh=mesh)
    K = lo.KernelGramOp(kernel, _rows(C).astype(dtype), mesh=mesh)
    # 1. Lanczos on K_CC from J(C) 1, and L with L L^T = K^+ on the Krylov space.
    v0 = J @ jnp.ones_like(flat)
    run = lo.lanczos(K, num_steps, v0=v0, restart=True)
    L = run.pinv_factor(rtol)
    tick(progress, 1, 4, unit="stage", after=L)  # the stages: Lanczos, J^T L, the GGN products, the rest
    # 2.-3. M = J(C)^T L by VJPs, and its thin SVD; directions below the cut-off are dropped.
    M = _by_columns(lambda W: J.T @ W, L, context_columns)
    U_M, D_M, _ = lo.svd(lo.Dense(M))
    U_M = U_M.as_matrix()
    keep = _cutoff(D_M, rtol)
    U_M = U_M * keep[None, :]
    D_M = jnp.where(keep, D_M, 0.0)
    tick(progress, 2, 4, unit="stage", after=U_M)
    # 4.-5. A = D^2 + U^T G U by GGN products, inverted in its whitened form A = D B D, B = I + D^-1 U^T G U D^-1:
    #    B's eigenvalues are at least 1, so A^-1 = D^-1 B^-1 D^-1 needs no cut-off. (A's own eigenvalues span
    #    D's range squared: a relative cut-off on them removed the directions of LEAST prior precision, the
    #    largest variances, which the extrapolation needs most.) A^-1 = W diag(s^2) W^T from the SVD of
    #    F = D^-1 U_B diag(lambda_B^-1/2), largest variance first.
    G = lo.GGNOp(fn, params, X, Y, likelihood, batch_size=batch_size, mesh=mesh)
    GU = U_M.T @ _by_columns(lambda W: G @ W, U_M, columns)
    tick(progress, 3, 4, unit="stage", after=GU)
    d_inv = jnp.where(keep, 1.0 / jnp.where(keep, D_M, 1.0), 0.0)
    B = jnp.eye(d_inv.shape[0], dtype=dtype) + d_inv[:, None] * ((GU + GU.T) / 2) * d_inv[None, :]
    lam_B, Q_B = lo.eigh(lo.Dense(B, tags={"symmetric"}))
    U_B = Q_B.as_matrix()
    W, s, _ = lo.svd(lo.Dense(d_inv[:, None] * U_B / jnp.sqrt(jnp.maximum(lam_B, 1.0))[None, :]))
    W = W.as_matrix()
    inv = s**2  # descending; dropped directions of M have s = 0
    V = U_M @ W
    # 6. Truncate the smallest eigenvalues of A (the largest variances, first) until the posterior variance is
    #    at most the prior variance at every context point (a relative slack of 10 eps for rounding).
    JS = _by_columns(lambda W: J @ W, V * jnp.sqrt(inv)[None, :], context_columns)
    tail = jnp.cumsum((JS**2)[:, ::-1], axis=1)[:, ::-1]
    tail = jnp.concatenate([tail, jnp.zeros((tail.shape[0], 1), dtype)], axis=1)
    prior_var = lo.diag(K).astype(dtype)
    ok = jnp.all(tail <= prior_var[:, None] * (1 + 10 * eps), axis=0)
    k = jnp.argmax(ok)
    d = jnp.where(jnp.arange(inv.shape[0]) >= k, inv, 0.0)
    ratio = jnp.max(jnp.take(tail, k, axis=1) / prior_var)
    info = FSPInfo(run.steps, run.restarts, jnp.sum(keep), k, ratio)
    tick(progress, 4, 4, unit="stage", after=d)
    return V, d, info


def fsp_laplace(fn, params, data, prior, context_points, *, likelihood: Likelihood, rank: int | None = None,
                batch_size: int | None = None, context_batch_size: int | None = None,
                rtol: float | None = None, mesh=None, progress: bool = True) -> FSPLaplacePosterior:
    r"""The FSP-Laplace posterior (algorithm 2): a GP prior at context points, matrix-free.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``; ``params`` the trained point $w^*$
            (e.g. from `fsp_objective`).
        data: the training ``(inputs, targets)``.
        prior: a `GPPrior` or a `linops.kernels.Kernel` (zero mean).
        context_points: ``(n_C, d)`` inputs where the prior is imposed (the paper: a regular
            grid or a low-discrepancy sequence, see `posteriors.context`), or ``(n_C, ...)`` inputs
            of the training inputs' shape (images), which the kernel sees flattened.
        likelihood: the training likelihood (its Hessian enters the GGN).
        rank: Lanczos steps on $K_{CC}$, at most $n_C O$ (default ``min(500, n_C O)``).
        batch_size: training examples per GGN batch (default: as many as hold $2^{25}$ numbers of
            the activations of 16 columns, the outputs of every operation of ``fn`` on one example).
        context_batch_size: context points per Jacobian batch (default: as for ``batch_size``).
            The products with the rank columns (the GGN's, the context Jacobian's) run in blocks of
            columns: a block holds the batch's activations and three parameter-length vectors per
            column, at most $2^{25}$ numbers or as many as the algorithm's own ``(P, rank)`` factors,
            whichever is more (LeNet-5 with 244,362 parameters, 256 images per batch, rank 500: 1.5 GB
            of temporaries, where all columns at once needed 67 GB). A large batch leaves room for
            few columns per block, and each block repeats the batch's forward pass.
        rtol: relative cut-off of the pseudo-inverses of $K_{CC}$ (its eigenvalues) and of
            $M = J(C)^\top L$ (its singular values). Default $10^{-6}$, in float32 and float64 alike: a
            direction dropped gets zero variance, one kept near the cut-off gets its variance with
            float32's rounding (its singular value to about $\epsilon / 10^{-6}$, 12%, its variance to
            twice that), and the first is the worse error. (A cut-off at the worst-case rounding level
            $n_C O\,\epsilon$ dropped directions float64 keeps from 100 context points on: 10 of 43
            kept on the weekly Mauna Loa record with 300, test log-likelihood -49.5 per week against
            float64's -6.2.)
            $A = D^2 + U^\top G U$ has no cut-off: it is inverted in its whitened form
            $D (I + D^{-1} U^\top G U D^{-1}) D$, whose middle factor has eigenvalues of at least 1.
            A direction dropped by a cut-off gets ZERO posterior variance, and the directions a
            cut-off relative to the largest value drops are those of least prior precision, the
            largest variances: the previous default, a fixed $10^{-6}$ on $A$'s eigenvalues too, halved the
            Mauna Loa test standard deviation (1.6 against 3.2 ppm; `docs/results/fsp.md`).
        mesh: a `jax.sharding.Mesh` with a ``"data"`` axis: the GGN products split the training
            examples over its devices, the context Jacobian its context points and the kernel Gram
            its row tiles (`linops.GGNOp`, `linops.JacobianOp`, `linops.kernels.KernelGramOp`); the
            result equals the single-device one to float round-off.
        progress: a progress bar on stderr over the algorithm's four stages (Lanczos on
            $K_{CC}$, the context Jacobian's products, the GGN products, the truncation), shown once
            the fit runs longer than two seconds; False silences it.

    Returns:
        An `FSPLaplacePosterior`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.kernels import Matern32
        >>> from linops.likelihoods import Gaussian
        >>> fn = lambda w, x: jnp.tanh(x @ w["a"]) @ w["b"]
        >>> w = {"a": jax.random.normal(jax.random.key(0), (1, 6)), "b": jnp.ones((6, 1)) / 6}
        >>> X = jnp.linspace(-1, 1, 10)[:, None]; Y = jnp.sin(3 * X)
        >>> post = pst.fsp_laplace(fn, w, (X, Y), Matern32(0.5), jnp.linspace(-2, 2, 20)[:, None],
        ...                        likelihood=Gaussian(0.1))
        >>> post.covariance.shape, post.sample(jax.random.key(1), 3).shape
        ((12, 12), (3, 12))
    """
    who = "fsp_laplace"
    prior = _as_prior(prior, who)
    check_likelihood(likelihood, who)
    check_data(data, who)
    check_params(params, who)
    X, Y = data
    C = jnp.asarray(context_points)
    check_finite(C, who, "the context points")
    num_outputs = _outputs(fn, params, C, who)
    kernel = prior.kernel_for(num_outputs, who)
    kernel.check_inputs(_rows(C))
    n = C.shape[0] * num_outputs
    if rank is None:
        rank = min(500, n)
    if not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"{who}: rank must be a positive integer, got {rank!r}")
    if rank > n:
        raise ValueError(f"{who}: rank {rank} needs at least that many context outputs, but {C.shape[0]} context "
                         f"points x {num_outputs} outputs give {n}: add context points or lower the rank")
    if rtol is None:
        rtol = 1e-6
    elif not 0.0 <= float(rtol) < 1.0:
        raise ValueError(f"{who}: rtol must lie in [0, 1), got {rtol!r}")
    for name, value in (("batch_size", batch_size), ("context_batch_size", context_batch_size)):
        if value is not None:  # before the plan, which sizes its blocks from them
            positive_int(value, name, who)
    plan = _products_plan(fn, params, X, C, int(rank), batch_size, context_batch_size)
    V, d, info = _algorithm2(fn, params, X, Y, C, kernel, likelihood, int(rank), plan, float(rtol), mesh,
                             "fsp_laplace" if progress else None)
    return FSPLaplacePosterior(fn, params, V, d, prior, info, batch_size=context_batch_size)


__all__ = ["FSPInfo", "FSPLaplacePosterior", "GPPrior", "fsp_laplace", "fsp_objective", "rkhs_norm"]
