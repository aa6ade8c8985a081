r"""Deep ensembles (Lakshminarayanan, Pritzel, Blundell; NeurIPS 2017): networks trained independently.

A deep ensemble is the equal-weight mixture of point masses at ``M`` separately trained parameter
vectors $\theta_1 \dots \theta_M$: each member starts from its own random initialisation and sees
the data in its own random order. Its predictive is the members' average,
$p(y \mid x) = \frac1M \sum_m p(y \mid f(\theta_m, x))$: mean class probabilities for a
classifier; for a Gaussian regression the mixture's mean $\bar\mu = \frac1M\sum_m \mu_m$ and
variance $\frac1M\sum_m (\mu_m - \bar\mu)^2 + \sigma^2$. It is not a Gaussian over the parameters;
its first two moments (`DeepEnsemble.mean`, `DeepEnsemble.covariance`) are those of the mixture.

`deep_ensemble` trains the members with Adam on the mean negative log-likelihood (plus
$\tfrac{\alpha}{2N}\|\theta\|^2$), all ``M`` in one vectorised program; `DeepEnsemble.from_members`
wraps members trained elsewhere. The paper's optional adversarial training is not included.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> import posteriors as pst
    >>> ens = pst.DeepEnsemble.from_members(lambda w, x: x @ w, [jnp.eye(2), -jnp.eye(2)])
    >>> pst.predictive.classification(ens, jnp.array([[3.0, 0.0]]))     # the members disagree: one half each
    Array([[0.5, 0.5]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import linops as lo
from linops.likelihoods import Gaussian, Likelihood
from linops.models import ravel
from linops.runtime import batched_map, canonical_convolutions, has_conv, program, tick
from posteriors._checks import check_data, check_likelihood, check_params, check_targets
from posteriors._training import check_step_settings, minibatch_loss, positive_int


class DeepEnsemble(eqx.Module):
    r"""``M`` trained parameter vectors of one model ``fn``, predicting by their average.

    Attributes:
        fn: the per-example model ``fn(params, x) -> (O,)``.
        members: the members' flat parameters, shape ``(M, P)``.
        unravel: flat vector ``(P,)`` to a params pytree.
        likelihood: the training likelihood, or None (`posteriors.predictive.regression` and
            `posteriors.predictive.nll` read it).

    Examples:
        >>> import jax.numpy as jnp
        >>> from posteriors.ensemble import DeepEnsemble
        >>> ens = DeepEnsemble.from_members(lambda w, x: (x @ w)[None], [jnp.array([1.0]), jnp.array([3.0])])
        >>> ens.mean, ens.covariance.as_matrix()            # the mixture's moments
        (Array([2.], dtype=float32), Array([[1.]], dtype=float32))
    """

    fn: Callable = eqx.field(static=True)
    members: jax.Array
    unravel: Callable = eqx.field(static=True)
    likelihood: Likelihood | None = None

    @classmethod
    def from_members(cls, fn: Callable, members: Sequence, likelihood: Likelihood | None = None) -> DeepEnsemble:
        """The ensemble of trained params pytrees ``members`` (at least two, all of one structure and shape)."""
        who = "DeepEnsemble.from_members"
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"{who}: an ensemble needs at least two members, got {len(members)}")
        flats, unravel = [], None
        structure = jax.tree_util.tree_structure(members[0])
        for i, m in enumerate(members):
            check_params(m, who)
            if jax.tree_util.tree_structure(m) != structure:
                raise ValueError(f"{who}: member {i}'s params differ in structure from member 0's")
            flat, un = ravel(m)
            if flats and flat.shape != flats[0].shape:
                raise ValueError(f"{who}: member {i} has {flat.shape[0]} parameters, member 0 {flats[0].shape[0]}")
            flats.append(flat)
            unravel = unravel or un
        return cls(fn, jnp.stack(flats), unravel, likelihood)

    @property
    def num_members(self) -> int:
        """$M$."""
        return self.members.shape[0]

    @property
    def params(self):
        """Member 0's params pytree (the structure every member shares)."""
        return self.unravel(self.members[0])

    @property
    def mean(self) -> jax.Array:
        r"""$\bar\theta = \frac1M\sum_m\theta_m$, shape ``(P,)``: the mixture's mean (not a network that predicts
        like the ensemble)."""
        return jnp.mean(self.members, axis=0)

    @property
    def covariance(self) -> lo.LinearOperator:
        r"""The mixture's covariance $\frac1M\sum_m(\theta_m - \bar\theta)(\theta_m - \bar\theta)^\top$, a lazy
        ``P x P`` `linops.LowRank` of rank at most $M - 1$."""
        centred = (self.members - self.mean[None, :]).T
        return lo.LowRank(centred, jnp.full(self.num_members, 1.0 / self.num_members, centred.dtype),
                          nonnegative=True)

    def member(self, i: int):
        """Member ``i``'s params pytree."""
        return self.unravel(self.members[i])

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` draws from the mixture: members chosen uniformly at random (with replacement), ``(n, P)``."""
        n = positive_int(n, "n", f"{type(self).__name__}.sample")
        return self.members[jax.random.randint(key, (n,), 0, self.num_members)]

    def outputs(self, inputs, *, batch_size: int = 512) -> jax.Array:
        """Every member's outputs on ``inputs``, shape ``(M, N, O)``, in chunks of ``batch_size`` inputs."""
        return _outputs(self, inputs, max(1, min(int(batch_size), jax.tree_util.tree_leaves(inputs)[0].shape[0])))

    def classification(self, inputs) -> jax.Array:
        """The members' mean class probabilities ``(N, K)`` (softmax; one output: the sigmoid, ``(N, 1)``)."""
        logits = self.outputs(inputs)
        link = jax.nn.sigmoid if logits.shape[-1] == 1 else (lambda z: jax.nn.softmax(z, axis=-1))
        return jnp.mean(link(logits), axis=0)

    def regression(self, inputs, sigma=None):
        r"""The mixture's ``(mean, variance)`` ``(N, O)``: $\bar\mu$ and $\frac1M\sum_m(\mu_m - \bar\mu)^2 + \sigma^2$
        (``sigma`` default: the ensemble's Gaussian likelihood's)."""
        if sigma is None:
            if not isinstance(self.likelihood, Gaussian) or self.likelihood.heteroscedastic:
                raise ValueError("DeepEnsemble.regression: the ensemble has no homoscedastic Gaussian likelihood; "
                                 "pass sigma=...")
            sigma = self.likelihood.sigma
        mu = self.outputs(inputs)
        return jnp.mean(mu, axis=0), jnp.var(mu, axis=0) + jnp.asarray(sigma) ** 2


@program
def _outputs(ens, inputs, batch_size):
    def chunk(x):
        return jax.vmap(lambda t: jax.vmap(ens.fn, in_axes=(None, 0))(ens.unravel(t), x))(ens.members)

    return jnp.moveaxis(batched_map(lambda x: jnp.moveaxis(chunk(x), 0, 1), inputs, batch_size), 1, 0)


def deep_ensemble(fn, init: Callable, data, likelihood: Likelihood, *, key: jax.Array, num_members: int = 5,
                  num_steps: int = 1000, learning_rate: float = 1e-3, batch_size: int = 128, prior_precision=0.0,
                  progress: bool = True) -> DeepEnsemble:
    r"""Train ``num_members`` networks independently and return them as a `DeepEnsemble`.

    Member ``m`` starts at ``init(k_m)`` and takes ``num_steps`` Adam steps on minibatches drawn with its own
    key, minimising the mean negative log-likelihood plus $\tfrac{\alpha}{2N}\|\theta\|^2$ (weight decay
    $\alpha/N$). All members train in one program: vectorised over the members, except on CPU for a network
    with convolutions, where they train one after another (a convolution vectorised over the members' weights
    becomes a grouped convolution, which XLA's CPU backend runs slower than the members in turn: see "SWAG and
    deep ensembles" in the docs). The members are the same either way, up to rounding.

    Args:
        fn: the per-example model ``fn(params, x) -> (O,)``.
        init: ``init(key) -> params``, a fresh random initialisation.
        data: ``(X, Y)`` training data.
        likelihood: a `linops.likelihoods` likelihood (kept on the ensemble for its predictives).
        key: every random choice (initialisations and minibatches).
        num_members: $M \ge 2$ (the paper's 5; the projected-Bayes paper's 10).
        num_steps: Adam steps per member.
        learning_rate: Adam's step size.
        batch_size: examples per step.
        prior_precision: $\alpha$ of the Gaussian prior (0: none).
        progress: a bar over the steps on stderr, shown after two seconds; False silences it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> X = jnp.linspace(-1, 1, 16)[:, None]; Y = 2 * X
        >>> ens = pst.deep_ensemble(lambda w, x: x @ w, lambda k: jax.random.normal(k, (1, 1)), (X, Y), Gaussian(0.1),
        ...                         key=jax.random.key(0), num_members=3, num_steps=300, learning_rate=0.1,
        ...                         batch_size=16, progress=False)
        >>> ens.num_members, jnp.round(ens.members[:, 0], 2)               # each member finds the slope 2
        (3, Array([2., 2., 2.], dtype=float32))
    """
    who = "deep_ensemble"
    check_likelihood(likelihood, who)
    check_data(data, who)
    num_members = positive_int(num_members, "num_members", who, minimum=2)
    num_steps = positive_int(num_steps, "num_steps", who)
    if not callable(init):
        raise TypeError(f"{who}: init must be a function key -> params, got {type(init).__name__}")
    n = jax.tree_util.tree_leaves(data[0])[0].shape[0]
    batch_size = min(positive_int(batch_size, "batch_size", who), n)
    k_init, k_data = jax.random.split(key)
    params0 = init(jax.random.fold_in(k_init, 0))
    check_params(params0, who)
    check_targets(fn, params0, data, likelihood, who)
    flat0, unravel = ravel(params0)
    check_step_settings(who, learning_rate, prior_precision, flat0.shape[0])
    starts = jnp.stack([flat0] + [_member_start(init, jax.random.fold_in(k_init, m), params0, m, who)
                                             for m in range(1, num_members)])
    in_turn = _members_in_turn(minibatch_loss(fn, unravel, data, likelihood, prior_precision, starts.dtype),
                               starts[0], batch_size)
    keys = jax.vmap(lambda k: jax.random.split(k, num_members))(jax.random.split(k_data, num_steps))
    # numbers as arrays: data of the compiled program, not part of its key (a new rate or prior compiles nothing)
    rate, alpha = (jax.device_put(np.asarray(v, starts.dtype)) for v in (learning_rate, prior_precision))
    members = _train_members(fn, unravel, data, likelihood, alpha, rate, starts, keys, batch_size=batch_size,
                             in_turn=in_turn, label=who if progress else None)
    if not isinstance(members, jax.core.Tracer):  # a diverged member is refused, never returned
        diverged = np.flatnonzero(~np.isfinite(np.asarray(members)).all(axis=1))
        if diverged.size:
            raise ValueError(f"{who}: the run diverged (members {diverged.tolist()} of {num_members} diverged to "
                             f"non-finite parameters); Adam at learning_rate={learning_rate!r} is too large for this "
                             "loss, use a smaller one")
    return DeepEnsemble(fn, members, unravel, likelihood)


def _member_start(init, key, params0, m, who):
    """Member ``m``'s initialisation, flat: the same structure, shapes and dtypes as member 0's, and finite."""
    params = init(key)
    if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(params0) or any(
            np.shape(a) != np.shape(b) or jnp.result_type(a) != jnp.result_type(b)
            for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params0), strict=True)):
        raise ValueError(f"{who}: init gave member {m} parameters of another structure, shape or dtype than "
                         "member 0's: init(key) must return the same pytree for every key")
    try:
        check_params(params, who)
    except ValueError:
        raise ValueError(f"{who}: init gave member {m} non-finite parameters") from None
    return ravel(params)[0]


@program
def _train_members(fn, unravel, data, likelihood, prior_precision, learning_rate, starts, keys, *, batch_size, in_turn,
                   label):
    """`deep_ensemble`'s training as one program (cached per model, shapes and options; the data are its
    arguments): Adam on each member's minibatches, vectorised over the members or ``in_turn``."""
    import optax

    n = jax.tree_util.tree_leaves(data[0])[0].shape[0]
    num_steps, num_members = keys.shape[:2]
    loss = minibatch_loss(fn, unravel, data, likelihood, prior_precision, starts.dtype)
    opt = optax.adam(learning_rate)

    def member_step(theta, state, k):
        idx = jax.random.choice(k, n, (batch_size,), replace=False) if batch_size < n else jnp.arange(n)
        updates, state = opt.update(jax.grad(loss)(theta, idx), state, theta)
        return optax.apply_updates(theta, updates), state

    total = num_steps * (num_members if in_turn else 1)

    def train(thetas, keys, offset):  # num_steps steps of the members in thetas (or of one member), keys (steps, ...)
        step_of = jax.vmap(member_step) if thetas.ndim == 2 else member_step

        def step(carry, ks):
            th, state, t = carry
            th, state = step_of(th, state, ks)
            tick(label, offset + t + 1, total, unit="step")
            return (th, state, t + 1), None

        init_state = (jax.vmap(opt.init) if thetas.ndim == 2 else opt.init)(thetas)
        return jax.lax.scan(canonical_convolutions(step), (thetas, init_state, jnp.asarray(0)), keys)[0][0]

    if not in_turn:
        return train(starts, keys, 0)
    return jax.lax.map(lambda a: train(a[0], a[1], a[2] * num_steps),
                       (starts, jnp.swapaxes(keys, 0, 1), jnp.arange(num_members)))


def _members_in_turn(loss, theta, batch_size) -> bool:
    """Whether to train the members one after another: on CPU when the network has convolutions."""
    if jax.default_backend() != "cpu":
        return False
    program = jax.make_jaxpr(jax.grad(loss))(theta, jnp.arange(batch_size)).jaxpr
    return has_conv(program)


__all__ = ["DeepEnsemble", "deep_ensemble"]
