r"""Save and load any posterior: its arrays with Equinox's serialisation, no pickle.

A file holds one line of JSON (the posterior's class, structure and leaf shapes, to refuse a
mismatched template with a clear error) followed by the leaves in Equinox's format. Loading
needs a template of the same kind (``like``): the functions and static structure come from
it, the arrays from the file. A template costs nothing to build with
``equinox.filter_eval_shape`` (see `load`). Samples after a round trip are the same bit for
bit under the same key.
"""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

_FORMAT = 1


def _header(post):
    leaves = [x for x in jax.tree_util.tree_leaves(post) if eqx.is_array_like(x) or isinstance(x, jax.ShapeDtypeStruct)]
    return {
        "format": _FORMAT,
        "class": type(post).__name__,
        "structure": getattr(post, "structure", None),
        "shapes": [list(np.shape(x)) for x in leaves],
        "dtypes": [str(np.dtype(x.dtype)) for x in leaves],
    }


def save(post, path) -> None:
    """Write ``post`` (any `GaussianPosterior`) to ``path``.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile, os
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(2), (jnp.eye(2), jnp.zeros((2, 1))), Gaussian(1.0))
        >>> path = os.path.join(tempfile.mkdtemp(), "post.eqx")
        >>> pst.save(post, path)
        >>> back = pst.load(path, post)
        >>> bool((back.sample(jax.random.key(0), 3) == post.sample(jax.random.key(0), 3)).all())
        True
    """
    with open(Path(path), "wb") as f:
        f.write((json.dumps(_header(post)) + "\n").encode())
        eqx.tree_serialise_leaves(f, post)


def load(path, like):
    """Read a posterior saved by `save`, into the structure of the template ``like``.

    ``like`` is a posterior of the same kind and shapes: the one you saved, or a free template
    ``eqx.filter_eval_shape(pst.laplace, fn, params, data, likelihood, structure=...)``.

    Raises:
        ValueError: the file is not a saved posterior, or ``like`` is another kind of posterior
            or has other shapes.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, tempfile, os
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> fn, data = (lambda w, x: (x @ w)[None]), (jnp.eye(2), jnp.zeros((2, 1)))
        >>> path = os.path.join(tempfile.mkdtemp(), "post.eqx")
        >>> pst.save(pst.laplace(fn, jnp.zeros(2), data, Gaussian(1.0), structure="diag"), path)
        >>> like = eqx.filter_eval_shape(pst.laplace, fn, jnp.zeros(2), data, Gaussian(1.0), structure="diag")
        >>> pst.load(path, like).covariance.as_matrix()
        Array([[0.5, 0. ],
               [0. , 0.5]], dtype=float32)
    """
    with open(Path(path), "rb") as f:
        first = f.readline()
        try:
            header = json.loads(first.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"load: {path} is not a posterior saved by posteriors.save") from None
        expected = _header(like)
        for key in ("class", "structure", "shapes", "dtypes"):
            if header.get(key) != expected[key]:
                raise ValueError(f"load: {path} holds a {header.get('class')} "
                                 f"(structure {header.get('structure')!r}) whose {key} differ from the template's "
                                 f"({expected['class']}, structure {expected['structure']!r}): build `like` with the "
                                 "same call that made the saved posterior")
        return eqx.tree_deserialise_leaves(f, like)


__all__ = ["load", "save"]
