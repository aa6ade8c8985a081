r"""Curvature of a network as lazy operators: `JacobianOp`, `GGNOp`, `LossJacobianOp`.

The model is a per-example ``fn(params, x) -> (O,)`` with a params pytree (raveled to
``R^P`` at the boundary). Products stream over the data in batches (`lax.scan`, the short
last batch included), so memory is ``O(P + batch)``: nothing of size ``N O x P`` or
``P x P`` is ever formed.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linops import closed_forms
from linops.algebra import _tags
from linops.algebra._base import LinearOperator
from linops.likelihoods import Likelihood
from linops.models import example_spec, ravel, unravel_of
from linops.nn._layer_dense import dense_chunk, dense_only, layer_dense_ggn
from linops.nn._layer_diag import layer_diag, layer_plan
from linops.runtime._batching import check_mesh as _check_mesh
from linops.runtime._batching import num_examples, sharded_map, sharded_sum
from linops.runtime._progress import check_label


def _flat(tree):
    return ravel(tree)[0]


def _check_model(fn, params, inputs, who):
    """``(N, O)``, or a `ValueError` saying what does not fit."""
    if not callable(fn):
        raise TypeError(f"{who}: fn must be callable fn(params, x) -> (O,), got {type(fn).__name__}")
    try:
        n = num_examples(inputs)
    except (ValueError, IndexError) as e:
        raise ValueError(f"{who}: inputs must have a leading example axis: {e}") from None
    if n == 0:
        raise ValueError(f"{who}: inputs has no examples")
    first = example_spec(inputs)
    try:
        out = jax.eval_shape(fn, params, first)
    except Exception as e:  # noqa: BLE001 - any failure here means params/inputs do not fit fn
        raise ValueError(f"{who}: fn(params, x) fails on the first example (do params match the model?): {e}") \
            from None
    if not isinstance(out, jax.ShapeDtypeStruct) or len(out.shape) != 1:
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(f"{who}: fn(params, x) must return one example's outputs of shape (O,), got {shape}")
    return n, out.shape[0]


def _check_likelihood(likelihood, who):
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"{who}: likelihood must be a linops.likelihoods.Likelihood, got {type(likelihood).__name__}")


def _check_batch_size(batch_size, who):
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise ValueError(f"{who}: batch_size must be a positive integer, got {batch_size!r}")


def per_example_likelihood(method, lik, axis, out, yb, *extra):
    """``lik.method(f_n, y_n, *extra_n)`` per example of a batch (``axis`` 0: ``lik`` is batched too)."""

    def one(lik_n, f, y, *e):
        return getattr(lik_n, method)(f, y, *e)

    return jax.vmap(one, in_axes=(axis, 0, 0) + (0,) * len(extra))(lik, out, yb, *extra)


def ggn_batch_product(fn, params, tangent, xb, yb, lik, lik_axis):
    r"""$\sum_{n \in \text{batch}} J_n^\top H_n J_n t$ as a flat vector: a JVP, $H_n$, a VJP."""
    f = lambda p: jax.vmap(fn, in_axes=(None, 0))(p, xb)  # noqa: E731
    out, jv = jax.jvp(f, (params,), (tangent,))
    hjv = per_example_likelihood("hvp", lik, lik_axis, out, yb, jv)
    _, vjp = jax.vjp(f, params)
    return _flat(vjp(hjv)[0])

_ROW_BUDGET = 1 << 25  # numbers of Jacobian rows held at once by the GGN diagonal (128 MB in float32)


class _ModelOperator(LinearOperator):
    """Shared fields and helpers of the operators built from ``(fn, params, inputs)``."""

    fn: Callable = eqx.field(static=True)
    params: object
    inputs: object
    batch_size: int = eqx.field(static=True)
    unravel: Callable = eqx.field(static=True)
    num_examples: int = eqx.field(static=True)
    num_outputs: int = eqx.field(static=True)
    num_params: int = eqx.field(static=True)
    dtype_: np.dtype = eqx.field(static=True)
    mesh: object = eqx.field(static=True)
    axis: str = eqx.field(static=True)
    progress: str | None = eqx.field(static=True)

    def _init_model(self, fn, params, inputs, batch_size, who, mesh=None, axis="data", progress=None):
        _check_batch_size(batch_size, who)
        check_label(progress, who)
        self.progress = progress
        self.mesh, self.axis = _check_mesh(mesh, axis, who)
        n, o = _check_model(fn, params, inputs, who)
        unravel = unravel_of(params)
        self.fn, self.params, self.inputs = fn, params, inputs
        self.batch_size = n if batch_size is None else int(batch_size)
        self.unravel = unravel
        self.num_examples, self.num_outputs, self.num_params = n, o, unravel.size
        self.dtype_ = np.dtype(unravel.dtype)

    @property
    def dtype(self):
        return self.dtype_

    def _sum(self, fn, data, batch_size, progress=None):
        """Sum of ``fn`` over batches; split over ``mesh``'s devices (and ``psum``-reduced) when there is one;
        ``progress``: a progress bar's label."""
        return sharded_sum(fn, data, batch_size, self.mesh, self.axis, progress)

    def _map(self, fn, data, batch_size):
        """``fn`` over batches, concatenated; split over ``mesh``'s devices when there is one."""
        return sharded_map(fn, data, batch_size, self.mesh, self.axis)

    def _batch_fn(self, xb):
        """``params -> (B, O)`` on a batch of inputs."""
        return lambda p: jax.vmap(self.fn, in_axes=(None, 0))(p, xb)

    def ravel(self, tree):
        """A params-shaped pytree as a vector of length ``P``."""
        return _flat(tree)


class JacobianOp(_ModelOperator):
    r"""The stacked Jacobian $J = [J_1; \dots; J_N] \in \mathbb R^{NO \times P}$ at ``params``.

    Products are JVPs (``J v``) and VJPs (``J^T u``), batched over the data (``batch_size``
    examples at a time; default all). Output index ``n * O + o`` is output ``o`` of example
    ``n``. Restrict to a parameter subset by composing with a `Selection`:
    ``J @ lo.Selection(idx, P).T`` applies JVPs of embedded tangents only.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        params: the params pytree (the linearisation point).
        inputs: the inputs, a pytree whose leaves have a leading example axis ``N``.
        batch_size: examples per batch (memory ``O(P + batch)``).
        mesh: a `jax.sharding.Mesh` to split the examples over (data parallel: each device streams
            over its share in batches, and sums are reduced with ``psum``); None (default) for one device.
        axis: the mesh axis the examples are split along (default ``"data"``).

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> fn = lambda w, x: jnp.tanh(x @ w)[None]            # one output
        >>> J = lo.JacobianOp(fn, jnp.zeros(2), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> J.as_matrix()
        Array([[1., 2.],
               [3., 4.]], dtype=float32)
    """

    def __init__(self, fn, params, inputs, *, batch_size: int | None = None, mesh=None, axis: str = "data"):
        self._init_model(fn, params, inputs, batch_size, "JacobianOp", mesh, axis)

    @property
    def shape(self):
        return (self.num_examples * self.num_outputs, self.num_params)

    def mv(self, v):
        t = self.unravel(v)

        def batch(xb):
            return jax.jvp(self._batch_fn(xb), (self.params,), (t,))[1]

        return self._map(batch, self.inputs, self.batch_size).reshape(-1)

    def rmv(self, u):
        U = u.reshape(self.num_examples, self.num_outputs)

        def batch(data):
            xb, ub = data
            _, vjp = jax.vjp(self._batch_fn(xb), self.params)
            return _flat(vjp(ub.astype(self.dtype))[0])

        return self._sum(batch, (self.inputs, U), self.batch_size)

    def example(self, n: int) -> JacobianOp:
        """The rows ``J_n`` of example ``n`` (an ``O x P`` operator)."""
        x = jax.tree_util.tree_map(lambda a: a[n : n + 1], self.inputs)
        return JacobianOp(self.fn, self.params, x)


class _LikelihoodOperator(_ModelOperator):
    targets: object
    likelihood: Likelihood

    def _init_lik(self, fn, params, inputs, targets, likelihood, batch_size, who, mesh=None, axis="data",
                  progress=None):
        self._init_model(fn, params, inputs, batch_size, who, mesh, axis, progress)
        _check_likelihood(likelihood, who)
        try:
            nt = num_examples(targets)
        except (ValueError, IndexError) as e:
            raise ValueError(f"{who}: targets must have a leading example axis: {e}") from None
        if nt != self.num_examples:
            raise ValueError(f"{who}: inputs has {self.num_examples} examples but targets has {nt}")
        likelihood.check(self.num_outputs, targets, self.num_examples, who)
        self.targets, self.likelihood = targets, likelihood

    def _data(self):
        lik = self.likelihood if self.likelihood.per_example else None
        return (self.inputs, self.targets, lik)

    def _lik_axis(self):
        return (None, 0) if self.likelihood.per_example else (self.likelihood, None)

    def _per_example(self, method, out, yb, lb, *extra):
        """``likelihood.method(f_n, y_n, *extra_n)`` for every example of a batch."""
        lik, axis = self._lik_axis()
        return per_example_likelihood(method, lb if axis == 0 else lik, axis, out, yb, *extra)


class GGNOp(_LikelihoodOperator):
    r"""The generalised Gauss-Newton matrix $G = \sum_n J_n^\top H_n J_n$ (``P x P``), lazily.

    Each product is, per batch, a JVP, the likelihood's closed-form output Hessian and a
    VJP, summed with `lax.scan` over full batches plus the short last batch (never
    dropped). Tagged symmetric and PSD. ``lo.diag(G)`` is exact: one reverse pass per row
    of a Hessian factor $A_n$ ($A_n^\top A_n = H_n$) to the outputs of the dense and
    convolutional layers found in ``fn``'s program (`linops.nn.find_layers`), whose blocks
    follow from per-layer rules (a dense layer on a vector never forms a per-example
    gradient); leaves in no such layer take their own per-example reverse passes;
    ``lo.diag(G, method="hutchinson", key=...)`` estimates it. ``G.as_matrix()`` costs
    ``P`` products and is only ever an explicit request.

    Its static structure is the model function, the shapes and the options, never its identity: a
    `GGNOp` built anew on new parameters or data of the same shapes (a refit) reuses every program
    compiled for the last one, as long as ``fn`` is the same function object.

    Args:
        fn: per-example model ``fn(params, x) -> (O,)``.
        params: the params pytree.
        inputs: inputs with a leading example axis ``N``.
        targets: targets with a leading example axis (shape set by the likelihood).
        likelihood: a `linops.likelihoods.Likelihood`.
        batch_size: examples per batch (default all).
        mesh: a `jax.sharding.Mesh` to split the examples over (data parallel: each device streams
            over its share in batches, and sums are reduced with ``psum``); None (default) for one device.
        axis: the mesh axis the examples are split along (default ``"data"``).
        progress: a label: ``as_matrix()`` and ``lo.diag(G)`` then show a progress bar over the batches
            under that label (once they run longer than two seconds); None (default): no bar.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> fn = lambda w, x: (x @ w)[None]                    # linear regression
        >>> X = jnp.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
        >>> G = lo.GGNOp(fn, jnp.zeros(2), X, jnp.zeros((3, 1)), lo.likelihoods.Gaussian(1.0), batch_size=2)
        >>> G.as_matrix()                                      # X^T X / sigma^2
        Array([[3., 3.],
               [3., 5.]], dtype=float32)
    """

    def __init__(self, fn, params, inputs, targets, likelihood: Likelihood, *, batch_size: int | None = None,
                 mesh=None, axis: str = "data", progress: str | None = None):
        self._init_lik(fn, params, inputs, targets, likelihood, batch_size, "GGNOp", mesh, axis, progress)

    @property
    def shape(self):
        return (self.num_params, self.num_params)

    @property
    def tags(self):
        return _tags.close({_tags.psd}, self.shape)

    def mv(self, v):
        t = self.unravel(v)
        lik, axis = self._lik_axis()

        def batch(data):
            xb, yb, lb = data
            return ggn_batch_product(self.fn, self.params, t, xb, yb, lb if axis == 0 else lik, axis)

        return self._sum(batch, self._data(), self.batch_size)

    rmv = mv

    def as_matrix(self):
        r"""The dense $G = \sum_n (A_n J_n)^\top (A_n J_n)$ from the rows of the Hessian factors.

        Per batch, the ``B K`` rows of $A_n J_n$ come from vector-Jacobian products (one per row
        of the likelihood's Hessian factor) and are accumulated as one matrix product, so the
        cost is about $NK$ reverse passes plus $NKP^2$ flops, not $P$ GGN products. A batch
        holds at most ``batch_size`` examples and at most about $2^{25}$ numbers of rows. When
        every parameter is the weight or bias of a dense layer on a vector (an MLP, a last layer),
        $K > 1$ and no layer is wider than its batches allow, the same matrix comes from exact
        Kronecker blocks per pair of leaves (`linops.nn._layer_dense`): $NP^2$ flops. Refused
        before any work when the ``P x P`` result would not fit in memory.
        """
        return self._as_matrix()

    def _as_matrix(self, per_example=None):
        """`as_matrix`; with ``per_example(f_n, y_n, lik_n)`` (`posteriors.laplace` sums the evidence's data terms
        with it): ``(G, its sum over the examples)``, the sum from the outputs of the same pass where the
        Kronecker blocks run, None otherwise."""
        from linops.memory import check_fits

        P, K = self.num_params, self.likelihood.factor_rows(self.num_outputs)
        itemsize = np.dtype(self.dtype).itemsize
        check_fits(P * P * itemsize, f"GGNOp({P} x {P}).as_matrix()",
                   "use lo.diag(G), a low-rank factor (lo.LanczosLowRankOp) or G @ V products instead")
        chunk = max(1, min(self.batch_size, (1 << 25) // max(K * P, 1)))
        plan = layer_plan(self.fn, self.params, jax.tree_util.tree_map(lambda a: a[0], self.inputs))
        block_chunk = dense_chunk(plan, self.batch_size) if plan is not None and dense_only(plan) else 0
        if K > 1 and block_chunk >= chunk:
            # Kronecker blocks: K times fewer flops than the rows, and no more batches each adding a P x P sum
            # (wide layers, out > K, would need smaller batches: then the rows)
            return layer_dense_ggn(plan, self.likelihood, self.inputs, self.targets, block_chunk, self.mesh,
                                   self.axis, self.progress, per_example)
        def batch(data):
            rows = self._batch_rows(data).reshape(-1, P)
            return rows.T @ rows

        G = self._sum(batch, self._data(), chunk, self.progress)
        return G if per_example is None else (G, None)

    def _batch_rows(self, data):
        """``(B, K, P)``: the rows of $A_n J_n$ for a batch's examples, one reverse pass per row (from the one
        forward pass of each example's VJP)."""
        lik, axis = self._lik_axis()

        def example(x, y, lik_n):
            out, vjp = jax.vjp(lambda p: self.fn(p, x), self.params)
            A = (lik if lik_n is None else lik_n).hessian_factor(out, y)
            return jax.vmap(lambda a: _flat(vjp(a)[0]))(A)

        xb, yb, lb = data
        return jax.vmap(example, in_axes=(0, 0, axis))(xb, yb, lb if axis == 0 else None)

    def rows(self):
        r"""The stacked rows $R = [A_1 J_1; \dots; A_N J_N]$ (``(N K, P)``, $K$ the likelihood's
        `factor_rows`), so that $G = R^\top R$: one reverse pass per row, ``batch_size`` examples at a
        time (split over ``mesh`` when there is one). Refused before any work when they cannot fit.

        Examples:
            >>> import jax.numpy as jnp, linops as lo
            >>> fn = lambda w, x: (x @ w)[None]
            >>> X = jnp.array([[1.0, 0.0], [1.0, 2.0]])
            >>> lo.GGNOp(fn, jnp.zeros(2), X, jnp.zeros((2, 1)), lo.likelihoods.Gaussian(0.5)).rows()   # X / sigma
            Array([[2., 0.],
                   [2., 4.]], dtype=float32)
        """
        from linops.memory import check_fits

        P, K, N = self.num_params, self.likelihood.factor_rows(self.num_outputs), self.num_examples
        check_fits(N * K * P * np.dtype(self.dtype).itemsize, f"GGNOp({P} x {P}).rows() ({N * K} rows)",
                   "use fewer examples, or G @ V products")
        chunk = max(1, min(self.batch_size, (1 << 25) // max(K * P, 1)))
        return self._map(self._batch_rows, self._data(), chunk).reshape(-1, P)

    def _diag_and_sums(self, per_example=None):
        """`lo.diag` of the GGN; with ``per_example(f_n, y_n, lik_n)`` (`posteriors.laplace` sums the evidence's data
        terms with it): ``(diagonal, its sum over the examples)`` from the per-layer rules' forward passes (the sum
        None on the general path, which has no per-layer pass). The dense and convolutional layers found in fn's
        program get their blocks by per-layer rules (no per-example gradient of the whole network: `_layer_diag`);
        a model with none takes the general path."""
        plan = layer_plan(self.fn, self.params, jax.tree_util.tree_map(lambda a: a[0], self.inputs))
        if plan is not None:
            return layer_diag(plan, self.likelihood, self.inputs, self.targets,
                              self.likelihood.factor_rows(self.num_outputs), self.batch_size, self.mesh, self.axis,
                              self.progress, per_example)
        d = self._diag_by_gradients()
        return d if per_example is None else (d, None)

    def _diag_by_gradients(self):
        # Example n adds the column sums of squares of its K rows A_n J_n (K x P). With many outputs (a
        # 1,000-class head) the rows are taken in blocks of at most ~2^25 numbers, one `lax.scan` step per
        # block, and the examples of a batch are bounded the same way: never K x P per example at once.
        P, K = self.num_params, self.likelihood.factor_rows(self.num_outputs)
        per_block = max(1, min(K, _ROW_BUDGET // max(P, 1)))
        num_blocks = -(-K // per_block)
        chunk = max(1, min(self.batch_size // per_block, _ROW_BUDGET // (per_block * max(P, 1))))

        def batch(data):
            xb, yb, lb = data
            out, _ = jax.vjp(self._batch_fn(xb), self.params)
            factors = self._per_example("hessian_factor", out, yb, lb)  # (B, K, O)

            def example(x, A):
                _, vjp = jax.vjp(lambda p: self.fn(p, x), self.params)
                squares = lambda A: jnp.sum(jax.vmap(lambda a: _flat(vjp(a)[0]))(A) ** 2, axis=0)  # noqa: E731
                if num_blocks == 1:
                    return squares(A)
                blocks = jnp.pad(A, ((0, num_blocks * per_block - K), (0, 0))).reshape(num_blocks, per_block, -1)
                return lax.scan(lambda acc, Ab: (acc + squares(Ab), None), jnp.zeros(P, out.dtype), blocks)[0]

            return jnp.sum(jax.vmap(example)(xb, factors), axis=0)

        return self._sum(batch, self._data(), chunk, self.progress)


@closed_forms.diag.register(GGNOp)
def _ggnop_diag(op):
    return op._diag_and_sums()


class LossJacobianOp(_LikelihoodOperator):
    r"""Stacked per-example loss gradients $J_L = [g_1^\top J_1; \dots; g_N^\top J_N] \in \mathbb R^{N \times P}$.

    $g_n = \partial \ell(f_n, y_n) / \partial f$ is the likelihood's output-space gradient at
    ``params``. Row ``n`` is the gradient of example ``n``'s loss. Used by the
    loss-projected posterior (one row per example, whatever ``O``).
    ``batch_size``, ``mesh`` and ``axis`` are as for `GGNOp`.

    Examples:
        >>> import jax.numpy as jnp, linops as lo
        >>> fn = lambda w, x: (x @ w)[None]
        >>> X, y = jnp.array([[1.0, 2.0]]), jnp.array([[1.0]])
        >>> lo.LossJacobianOp(fn, jnp.zeros(2), X, y, lo.likelihoods.Gaussian(1.0)).as_matrix()
        Array([[-1., -2.]], dtype=float32)
    """

    def __init__(self, fn, params, inputs, targets, likelihood: Likelihood, *, batch_size: int | None = None,
                 mesh=None, axis: str = "data"):
        self._init_lik(fn, params, inputs, targets, likelihood, batch_size, "LossJacobianOp", mesh, axis)

    @property
    def shape(self):
        return (self.num_examples, self.num_params)

    def mv(self, v):
        t = self.unravel(v)

        def batch(data):
            xb, yb, lb = data
            out, jv = jax.jvp(self._batch_fn(xb), (self.params,), (t,))
            g = self._per_example("grad", out, yb, lb)
            return jnp.sum(g * jv, axis=-1)

        return self._map(batch, self._data(), self.batch_size)

    def rmv(self, u):
        def batch(data):
            (xb, yb, lb), ub = data
            out, vjp = jax.vjp(self._batch_fn(xb), self.params)
            g = self._per_example("grad", out, yb, lb)
            return _flat(vjp(ub[:, None].astype(g.dtype) * g)[0])

        return self._sum(batch, (self._data(), u), self.batch_size)
