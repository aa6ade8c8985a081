"""`pst.save` / `pst.load`: no data lost on a failed save, corrupt files refused, every field kept."""

import errno
import json
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posteriors as pst
import posteriors.io
from linops.likelihoods import Gaussian
from linops.models import from_equinox
from tests import _draws as draws


def _fn(w, x):
    return jnp.tanh(x @ w[:3])[None] * w[3]


def _problem(n=20):
    X = draws.normal(jax.random.key(0), (n, 3), jnp.float64)
    return _fn, jnp.array([0.5, -1.0, 0.3, 2.0]), (X, jnp.sin(X[:, :1]))


def _laplace(structure="diag", n=20, sigma=0.3):
    fn, params, data = _problem(n)
    return pst.laplace(fn, params, data, Gaussian(sigma), structure=structure)


def _assert_same_posterior(a, b):
    """Every leaf equal bit for bit (path, type, dtype, values), and the same tree definition: class and
    every static field (structure, num_examples, the functions, ...)."""
    leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
    assert tree_a == tree_b
    for (path_a, x), (path_b, y) in zip(leaves_a, leaves_b, strict=True):
        assert path_a == path_b
        assert type(x) is type(y), jax.tree_util.keystr(path_a)
        assert np.asarray(x).dtype == np.asarray(y).dtype, jax.tree_util.keystr(path_a)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path_a))


def _save_format_1(post, path):
    """The writer of file format 1 (before the first release), kept to check that its files are refused clearly."""
    leaves = [x for x in jax.tree_util.tree_leaves(post) if eqx.is_array_like(x)]
    header = {"format": 1, "class": type(post).__name__, "structure": getattr(post, "structure", None),
              "shapes": [list(np.shape(x)) for x in leaves], "dtypes": [str(np.dtype(x.dtype)) for x in leaves]}
    with open(path, "wb") as f:
        f.write((json.dumps(header) + "\n").encode())
        eqx.tree_serialise_leaves(f, post)


def test_gaussian_posterior_round_trips_every_field_into_a_free_template(tmp_path):
    fn, params, data = _problem()
    # sigma, the noise scale and the prior all differ from the template's call: they must come from the file
    post = pst.laplace(fn, params, data, Gaussian(0.3), structure="full").with_prior(prior_precision=2.0, sigma=0.7)
    pst.save(post, tmp_path / "post.eqx")
    like = eqx.filter_eval_shape(pst.laplace, fn, params, data, Gaussian(0.3), structure="full")
    back = pst.load(tmp_path / "post.eqx", like)
    _assert_same_posterior(back, post)
    assert float(back.likelihood.sigma) == 0.7
    assert float(back.noise_scale) == float(post.noise_scale) != 1.0


def test_save_keeps_the_previous_file_when_the_disk_fills_midway(tmp_path, monkeypatch):
    path = tmp_path / "post.eqx"
    old = _laplace(sigma=0.3)
    pst.save(old, path)
    before = path.read_bytes()

    def write_half_then_fail(f, digest, leaves):
        f.write(b"\0" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(posteriors.io, "_write_leaves", write_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        pst.save(_laplace(sigma=0.9), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["post.eqx"]  # the temporary file is gone
    monkeypatch.undo()
    _assert_same_posterior(pst.load(path, old), old)


def test_save_keeps_the_previous_file_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "post.eqx"
    pst.save(_laplace(sigma=0.3), path)
    before = path.read_bytes()

    def fail(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(PermissionError):
        pst.save(_laplace(sigma=0.9), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["post.eqx"]


def test_save_keeps_the_permissions_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "post.eqx"
    pst.save(_laplace(), path)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # a new file, as open() would make it
    os.chmod(path, 0o640)
    pst.save(_laplace(), path)
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_save_refuses_a_symbolic_link_and_leaves_link_and_target_alone(tmp_path):
    target, link = tmp_path / "run3.eqx", tmp_path / "latest.eqx"
    pst.save(_laplace(sigma=0.3), target)
    before = target.read_bytes()
    link.symlink_to(target)
    with pytest.raises(ValueError, match=r"save: .*latest\.eqx is a symbolic link"):
        pst.save(_laplace(sigma=0.9), link)
    assert link.is_symlink() and target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["latest.eqx", "run3.eqx"]


def test_save_refuses_what_is_not_a_posterior_before_writing(tmp_path):
    path = tmp_path / "post.eqx"
    with pytest.raises(TypeError, match="save: post must be a posterior .* got builtins.dict"):
        pst.save({"mean": jnp.zeros(2)}, path)
    with pytest.raises(TypeError, match="save: post must be a posterior .* got linops.likelihoods.Gaussian"):
        pst.save(Gaussian(1.0), path)
    assert os.listdir(tmp_path) == []
    with pytest.raises(TypeError, match="load: like must be a posterior"):
        pst.load(path, {"mean": jnp.zeros(2)})


def test_save_refuses_a_leaf_that_is_not_an_array_and_names_it(tmp_path):
    path = tmp_path / "post.eqx"
    pst.save(_laplace(), path)
    before = path.read_bytes()
    bad = eqx.tree_at(lambda p: p.loss, _laplace(), "not an array")
    with pytest.raises(TypeError, match=r"save: leaf \.loss of the posterior is a builtins\.str"):
        pst.save(bad, path)
    key_leaf = eqx.tree_at(lambda p: p.noise_scale, _laplace(), jax.random.key(0))
    with pytest.raises(TypeError, match=r"save: leaf \.noise_scale has dtype key.*jax\.random\.key_data"):
        pst.save(key_leaf, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["post.eqx"]


def test_python_number_numpy_and_empty_leaves_round_trip_with_their_type(tmp_path):
    odd = (1.0, np.arange(3, dtype=np.int16), jnp.zeros((0, 2), jnp.bfloat16))
    post = eqx.tree_at(lambda p: (p.noise_scale, p.loss, p.residual_ss), _laplace(), odd)
    pst.save(post, tmp_path / "post.eqx")
    back = pst.load(tmp_path / "post.eqx", post)
    assert type(back.noise_scale) is float and back.noise_scale == 1.0
    assert type(back.loss) is np.ndarray and back.residual_ss.dtype == jnp.bfloat16
    _assert_same_posterior(back, post)


@pytest.mark.parametrize("cut", ["inside the header", "after the header", "inside the data", "inside the checksum"])
def test_load_reports_a_truncated_file(cut, tmp_path):
    path = tmp_path / "post.eqx"
    post = _laplace()
    pst.save(post, path)
    data = path.read_bytes()
    header_bytes = data.index(b"\n") + 1
    keep = {"inside the header": 20, "after the header": header_bytes,
            "inside the data": (header_bytes + len(data)) // 2, "inside the checksum": len(data) - 10}[cut]
    path.write_bytes(data[:keep])
    with pytest.raises(ValueError, match="is truncated"):
        pst.load(path, post)


@pytest.mark.parametrize("where", ["data", "header", "checksum"])
def test_load_reports_a_modified_file(where, tmp_path):
    path = tmp_path / "post.eqx"
    post = _laplace()
    pst.save(post, path)
    data = bytearray(path.read_bytes())
    if where == "header":  # still valid JSON, still a diag posterior's shapes: only the checksum can tell
        i = data.index(b'".num_examples": 20')
        data[i + len('".num_examples": 2')] = ord("1")
    else:
        i = {"data": data.index(b"\n") + 30, "checksum": len(data) - 5}[where]
        data[i] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        pst.load(path, post)


def test_load_reports_bytes_appended_to_a_file(tmp_path):
    path = tmp_path / "post.eqx"
    post = _laplace()
    pst.save(post, path)
    path.write_bytes(path.read_bytes() + b"extra")
    with pytest.raises(ValueError, match="5 bytes after its end"):
        pst.load(path, post)


def test_load_names_a_static_field_that_differs_from_the_template(tmp_path):
    # a diagonal posterior's arrays do not depend on N: only the static field tells 20 from 25 examples
    pst.save(_laplace("diag", n=20), tmp_path / "post.eqx")
    fn, params, data = _problem(25)
    like = eqx.filter_eval_shape(pst.laplace, fn, params, data, Gaussian(0.3), structure="diag")
    with pytest.raises(ValueError, match=r"match the template in its static fields: \.num_examples is 20 in the "
                                         r"file and 25 in the template"):
        pst.load(tmp_path / "post.eqx", like)


def test_load_names_the_structure_that_differs_from_the_template(tmp_path):
    pst.save(_laplace("diag"), tmp_path / "post.eqx")
    with pytest.raises(ValueError, match=r"not match the template in its structure: 'diag' in the file, 'full' in"):
        pst.load(tmp_path / "post.eqx", _laplace("full"))


def test_load_refuses_a_file_that_is_not_a_saved_posterior(tmp_path):
    post = _laplace()
    (tmp_path / "empty.eqx").write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        pst.load(tmp_path / "empty.eqx", post)
    np.save(tmp_path / "array.npy", np.zeros(3))
    with pytest.raises(ValueError, match="is not a posterior saved by posteriors.save"):
        pst.load(tmp_path / "array.npy", post)


def test_load_refuses_a_file_of_a_newer_format(tmp_path):
    path = tmp_path / "post.eqx"
    post = _laplace()
    pst.save(post, path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'{"format": 2,', b'{"format": 3,', 1))
    with pytest.raises(ValueError, match=r"written by a newer version of posteriors \(file format 3; this version "
                                         r"reads format 2\)"):
        pst.load(path, post)


def test_files_of_format_1_are_refused_with_the_reason(tmp_path):
    fn, params, data = _problem()
    post = pst.laplace(fn, params, data, Gaussian(0.3), structure="full").with_prior(sigma=0.7)
    _save_format_1(post, tmp_path / "old.eqx")
    like = eqx.filter_eval_shape(pst.laplace, fn, params, data, Gaussian(0.3), structure="full")
    with pytest.raises(ValueError, match=r"has file format 1 .* which this version does not read; it reads format 2"):
        pst.load(tmp_path / "old.eqx", like)


def _subnetwork_problem():
    fn, params, data = _problem()
    return fn, params, data, Gaussian(0.3), pst.subnetwork.from_indices(params, [0, 3])


def test_subnetwork_posterior_loads_into_a_free_template(tmp_path):
    args = _subnetwork_problem()
    post = pst.subnetwork_laplace(*args, prior_precision=2.0)
    pst.save(post, tmp_path / "post.eqx")
    like = eqx.filter_eval_shape(pst.subnetwork_laplace, *args, prior_precision=2.0)
    back = pst.load(tmp_path / "post.eqx", like)
    _assert_same_posterior(back, post)
    key = jax.random.key(3)
    assert bool(jnp.all(back.sample(key, 4) == post.sample(key, 4)))


def test_subnetwork_laplace_with_traced_indices_equals_the_eager_one():
    # under jit the subnetwork's indices are traced: the other way to restrict the model must give the same values
    args = _subnetwork_problem()
    eager = pst.subnetwork_laplace(*args, prior_precision=2.0)
    jitted = eqx.filter_jit(pst.subnetwork_laplace)(*args, prior_precision=2.0)
    np.testing.assert_allclose(jitted.covariance.as_matrix(), eager.covariance.as_matrix(), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(jitted.weights.indices, eager.weights.indices)
    assert jitted.weights.indices.dtype == eager.weights.indices.dtype


def test_projected_and_fsp_posteriors_load_into_free_templates(tmp_path):
    from linops.kernels import RBF

    _, _, (X, Y) = _problem()
    model = eqx.nn.MLP(3, 1, 4, 1, activation=jnp.tanh, key=jax.random.key(1), dtype=jnp.float64)
    fn, params = from_equinox(model)  # 21 parameters
    post = pst.projected_posterior(fn, params, X[:4], batch_size=2, prior_precision=2.0)
    pst.save(post, tmp_path / "projected.eqx")
    like = eqx.filter_eval_shape(pst.projected_posterior, fn, params, X[:4], batch_size=2, prior_precision=2.0)
    back = pst.load(tmp_path / "projected.eqx", like)
    for x, y in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(post), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(back.covariance.as_matrix(), post.covariance.as_matrix())

    args = (fn, params, (X, Y), RBF(), X[:5])
    post = pst.fsp_laplace(*args, likelihood=Gaussian(0.3))
    pst.save(post, tmp_path / "fsp.eqx")
    back = pst.load(tmp_path / "fsp.eqx", eqx.filter_eval_shape(pst.fsp_laplace, *args, likelihood=Gaussian(0.3)))
    _assert_same_posterior(back, post)
