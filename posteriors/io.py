r"""Save and load any posterior: its arrays, its settings and a checksum in one file, no pickle.

A file (format 2) holds, in order:

1. one line of JSON, the header: the format number, the posterior's class, each array leaf's
   path, dtype and shape, the static fields that are plain data (``structure``,
   ``num_examples``, a KFAC posterior's layer sizes, ...) and the number of data bytes;
2. the leaves' bytes, C order, in the order of ``jax.tree_util.tree_leaves``;
3. ``sha256:<64 hex digits>`` and a newline: the SHA-256 of (1) and (2).

`save` writes a temporary file next to ``path`` and renames it onto ``path`` only once it is
complete and on disk, so an interrupted save or a full disk leaves the previous file as it was.
`load` reads no array before the file passed its checks (length, checksum) and the template
``like`` matched it (class, leaves, static fields). Functions (the model ``fn``, ``unravel``)
cannot be stored without running code on load: they come from the template, which costs nothing
to build with ``equinox.filter_eval_shape`` (see `load`). Files of format 1 (no checksum, no
static fields; written before the first release) are refused with an error that says so.
Samples after a round trip are the same bit for bit under the same key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import stat
import sys
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

_FORMAT = 2
_TRAILER = re.compile(rb"sha256:([0-9a-f]{64})\n\Z")
_TRAILER_BYTES = 72  # b"sha256:" + 64 hex digits + b"\n"
_MAX_HEADER_BYTES = 1 << 26
_CHUNK_BYTES = 1 << 20
_PYTHON_NUMBERS = (bool, int, float, complex)
_NOT_STORED = object()


def _check_posterior(obj, who: str, what: str) -> None:
    from posteriors.ensemble import DeepEnsemble
    from posteriors.gaussian import GaussianPosterior

    if not isinstance(obj, (GaussianPosterior, DeepEnsemble)):
        raise TypeError(f"{who}: {what} must be a posterior (a posteriors.GaussianPosterior, e.g. from pst.laplace, "
                        f"or a posteriors.DeepEnsemble), got {type(obj).__module__}.{type(obj).__qualname__}")


def _leaf_entry(name: str, x, who: str, template: bool) -> dict:
    """``{"path", "kind", "dtype", "shape"}`` of one leaf, or a `TypeError` naming it."""
    if isinstance(x, jax.ShapeDtypeStruct) or (template and isinstance(x, jax.core.Tracer)):
        kind = "jax"
    elif isinstance(x, jax.core.Tracer):
        raise TypeError(f"{who}: leaf {name} of the posterior is a traced array ({x.dtype}{list(x.shape)}): call "
                        "save outside jax.jit / jax.vmap, on a concrete posterior")
    elif isinstance(x, jax.Array):
        if not template and x.is_deleted():
            raise TypeError(f"{who}: leaf {name} of the posterior is a deleted (donated) jax array")
        kind = "jax"
    elif isinstance(x, (np.ndarray, np.generic)):
        kind = "numpy"
    elif isinstance(x, _PYTHON_NUMBERS):
        kind = type(x).__name__
        x = np.asarray(x)
    else:
        owner = "the template" if template else "the posterior"
        raise TypeError(f"{who}: leaf {name} of {owner} is a {type(x).__module__}.{type(x).__qualname__}; a posterior "
                        "file stores arrays and Python numbers: make it an array, or a static field "
                        "(eqx.field(static=True)) that the template provides")
    if not (jax.numpy.issubdtype(x.dtype, jax.numpy.number) or jax.numpy.issubdtype(x.dtype, jax.numpy.bool_)):
        raise TypeError(f"{who}: leaf {name} has dtype {x.dtype}; a posterior file stores boolean and numeric arrays "
                        "(for a PRNG key, store jax.random.key_data(key))")
    return {"path": name, "kind": kind, "dtype": np.dtype(x.dtype).name, "shape": [int(n) for n in x.shape]}


def _plain(value):
    """``value`` as JSON data (tuples become lists), or ``_NOT_STORED`` (functions, other objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic) and np.dtype(value.dtype).kind in "biuf":
        return value.item()
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return _NOT_STORED if any(v is _NOT_STORED for v in items) else items
    return _NOT_STORED


def _static_fields(obj, prefix: str, out: dict) -> dict:
    """The static fields of every Equinox module in ``obj``, ``{path: plain value or _NOT_STORED}``."""
    if isinstance(obj, eqx.Module):
        for field in dataclasses.fields(obj):
            name, value = f"{prefix}.{field.name}", getattr(obj, field.name, None)
            if field.metadata.get("static", False):
                out[name] = _plain(value)
            else:
                _static_fields(value, name, out)
        return out
    children = jax.tree_util.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj and isinstance(x, eqx.Module))
    for path, child in children[0]:
        if isinstance(child, eqx.Module):
            _static_fields(child, prefix + jax.tree_util.keystr(path), out)
    return out


def _describe(post, who: str, template: bool) -> dict:
    """The header of ``post``: class, leaves, static fields; refuses what a file cannot hold."""
    leaves = [_leaf_entry(jax.tree_util.keystr(path), x, who, template)
              for path, x in jax.tree_util.tree_flatten_with_path(post)[0]]
    statics = _static_fields(post, "", {})
    return {
        "format": _FORMAT,
        "class": type(post).__name__,
        "structure": getattr(post, "structure", None),
        "byteorder": sys.byteorder,
        "leaves": leaves,
        "static": {k: v for k, v in statics.items() if v is not _NOT_STORED},
        "data_bytes": sum(math.prod(e["shape"]) * np.dtype(_dtype(e["dtype"])).itemsize for e in leaves),
    }


def _dtype(name: str):
    return jax.numpy.dtype(name)  # knows bfloat16 and the other ml_dtypes names


def _write_leaves(f, digest, leaves) -> None:
    """Write each leaf's bytes (C order, native byte order) to ``f`` and into ``digest``."""
    for x in leaves:
        a = np.ascontiguousarray(np.asarray(x))
        if a.dtype.byteorder not in "=|":
            a = a.astype(a.dtype.newbyteorder("="))
        data = a.reshape(-1).view(np.uint8)
        digest.update(data)
        f.write(data)


def _temporary_file(folder: Path, name: str):
    """A new file next to the target (same file system, so the rename is atomic), created with the
    permissions a new file gets (the umask applies, unlike ``tempfile.mkstemp``'s 0600)."""
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"save: could not create a temporary file in {folder}")


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX: fsync the folder); a no-op where folders cannot be opened."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(post, path) -> None:
    """Write the posterior ``post`` to ``path``, replacing the file there only once the new one is complete.

    The file holds the arrays, the static fields that are plain data and a SHA-256 checksum
    (module docstring). It is written to a temporary file in the same folder (named
    ``.<name>.<random>.tmp``), flushed to disk and renamed onto ``path``: if anything fails
    (an error, a full disk, an interrupt) the temporary file is removed and a file already at
    ``path`` is left as it was; if the process is killed, the temporary file may remain.
    ``path`` must not be a symbolic link: replacing the link would break it, and writing
    through it would replace another file, so both are refused.

    Raises:
        TypeError: ``post`` is not a posterior, or one of its leaves is not an array or a Python
            number (the error names the leaf); nothing is written.
        ValueError: ``path`` is a symbolic link, a folder or another non-regular file.

    Examples:
        >>> import jax, jax.numpy as jnp, tempfile, os
        >>> import posteriors as pst
        >>> from linops.likelihoods import Gaussian
        >>> post = pst.laplace(lambda w, x: (x @ w)[None], jnp.zeros(2), (jnp.eye(2), jnp.zeros((2, 1))), Gaussian(1.0))
        >>> path = os.path.join(tempfile.mkdtemp(), "post.eqx")
        >>> pst.save(post, path)
        >>> back = pst.load(path, post)
        >>> bool((back.sample(jax.random.key(0), 3) == post.sample(jax.random.key(0), 3)).all())
        True
        >>> pst.save({"mean": jnp.zeros(2)}, path)
        Traceback (most recent call last):
        ...
        TypeError: save: post must be a posterior (a posteriors.GaussianPosterior, ...), got builtins.dict
    """
    who = "save"
    _check_posterior(post, who, "post")
    header = _describe(post, who, template=False)
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{who}: {path} is a symbolic link (to {os.readlink(path)}); save writes regular files only: "
                         "pass the path of the file itself, or remove the link")
    if path.exists() and not path.is_file():
        raise ValueError(f"{who}: {path} exists and is not a regular file (a folder?); pass a file path")
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{who}: the folder {folder} of {path} does not exist")
    # a rename would replace a write-protected file all the same (and root may write anyway): its mode bits decide,
    # as rm's prompt does
    if path.exists() and (not os.access(path, os.W_OK) or not path.stat().st_mode & stat.S_IWUSR):
        raise PermissionError(f"{who}: {path} is write-protected (mode {oct(stat.S_IMODE(path.stat().st_mode))}); "
                              "save never replaces a file you could not write: make it writable or choose another path")
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else None
    head = (json.dumps(header) + "\n").encode()
    tmp, fd = _temporary_file(folder, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            digest = hashlib.sha256(head)
            f.write(head)
            _write_leaves(f, digest, jax.tree_util.tree_leaves(post))
            f.write(b"sha256:" + digest.hexdigest().encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(folder)


def _read_header(f, path, size):
    line = f.readline(_MAX_HEADER_BYTES)
    if not line:
        raise ValueError(f"load: {path} is empty: truncated (an interrupted save?) or not a saved posterior")
    if not line.endswith(b"\n"):
        if line.startswith(b'{"format"') and len(line) == size:
            raise ValueError(f"load: {path} is truncated: it ends inside its header, after {size} bytes")
        raise ValueError(f"load: {path} is not a posterior saved by posteriors.save")
    try:
        header = json.loads(line.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # a hostile header: nested past the stack
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("format"), int):
        raise ValueError(f"load: {path} is not a posterior saved by posteriors.save")
    return line, header


def _check_integrity(f, path, line, size, header) -> None:
    """The file is as long as its header says and its SHA-256 matches: raises otherwise."""
    data_bytes = header.get("data_bytes")
    expected = len(line) + data_bytes + _TRAILER_BYTES if isinstance(data_bytes, int) else None
    body = size - _TRAILER_BYTES
    trailer = None
    if body >= len(line):
        f.seek(body)
        trailer = _TRAILER.match(f.read(_TRAILER_BYTES))
    if trailer is None:
        if expected is not None and size < expected:
            raise ValueError(f"load: {path} is truncated: it has {size} bytes but its header announces {expected} "
                             "(an interrupted save or copy?)")
        if expected is not None and size > expected:
            raise ValueError(f"load: {path} is corrupted: it has {size - expected} bytes after its end (the "
                             "checksum line)")
        raise ValueError(f"load: {path} is corrupted: checksum mismatch (its checksum line at the end is damaged)")
    digest = hashlib.sha256()
    f.seek(0)
    remaining = body
    while remaining:
        chunk = f.read(min(_CHUNK_BYTES, remaining))
        if not chunk:
            break
        digest.update(chunk)
        remaining -= len(chunk)
    if digest.hexdigest().encode() != trailer.group(1):
        raise ValueError(f"load: {path} is corrupted: checksum mismatch (SHA-256 {digest.hexdigest()} of its contents, "
                         f"{trailer.group(1).decode()} recorded when it was saved)")
    if size != expected:
        raise ValueError(f"load: {path} has {size} bytes but its header announces {expected}: not a file written by "
                         "posteriors.save")


def _mismatch(path, header, what, detail):
    return ValueError(f"load: {path} holds a {header.get('class')} (structure {header.get('structure')!r}) "
                      f"that does not match the template in its {what}: {detail}; build `like` with the same call "
                      "that made the saved posterior (eqx.filter_eval_shape(pst.laplace, fn, params, data, "
                      "likelihood, ...))")


def _compare(path, saved, expected) -> None:
    """The template ``like`` describes the same posterior as the file: class, leaves, static fields."""
    if saved["class"] != expected["class"]:
        raise _mismatch(path, saved, "class", f"{saved['class']} in the file, {expected['class']} in the template")
    if saved["structure"] != expected["structure"]:
        raise _mismatch(path, saved, "structure", f"{saved['structure']!r} in the file, {expected['structure']!r} in "
                        "the template")
    paths = [e["path"] for e in saved["leaves"]], [e["path"] for e in expected["leaves"]]
    if paths[0] != paths[1]:
        only = sorted(set(paths[0]) - set(paths[1])), sorted(set(paths[1]) - set(paths[0]))
        raise _mismatch(path, saved, "leaves", f"{len(paths[0])} leaves in the file, {len(paths[1])} in the template; "
                        f"only in the file: {only[0]}, only in the template: {only[1]}")
    for s, e in zip(saved["leaves"], expected["leaves"], strict=True):
        if (s["shape"], s["dtype"]) != (e["shape"], e["dtype"]):
            raise _mismatch(path, saved, "shapes or dtypes", f"leaf {s['path']} is {s['dtype']}{s['shape']} in the "
                            f"file and {e['dtype']}{e['shape']} in the template")
    static = json.loads(json.dumps(expected["static"]))  # tuples as lists, as in the file
    for name in sorted(set(saved["static"]) | set(static)):
        shown = [json.dumps(d[name]) if name in d else "not stored (a function or other object)"
                 for d in (saved["static"], static)]
        if shown[0] != shown[1]:
            raise _mismatch(path, saved, "static fields", f"{name} is {shown[0]} in the file and {shown[1]} in the "
                            "template")


def _read_leaves(f, header, like):
    swap = header["byteorder"] != sys.byteorder
    leaves = []
    for entry in header["leaves"]:
        dtype = _dtype(entry["dtype"])
        count = math.prod(entry["shape"])
        a = np.frombuffer(f.read(count * dtype.itemsize), dtype, count).reshape(entry["shape"])
        a = a.byteswap() if swap else a.copy()
        if entry["kind"] == "jax":
            leaves.append(jax.numpy.asarray(a))
        elif entry["kind"] == "numpy":
            leaves.append(a)
        else:
            leaves.append({"bool": bool, "int": int, "float": float, "complex": complex}[entry["kind"]](a.item()))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


def load(path, like):
    """Read a posterior saved by `save`, into the structure of the template ``like``.

    ``like`` is a posterior of the same kind and shapes: the one you saved, or a free template
    ``eqx.filter_eval_shape(pst.laplace, fn, params, data, likelihood, structure=...)``; its
    functions and the static fields a file cannot hold come from it. Before any array is
    read, the file's length and checksum are checked, then the template against the file:
    same class, same leaves (paths, shapes, dtypes), same static fields (``num_examples``,
    ``structure``, the selection of weights' leaves, ...). A file of format 1 (before the first
    release) is refused.

    Raises:
        TypeError: ``like`` is not a posterior.
        ValueError: the file is not a saved posterior, is truncated ("truncated"), was modified
            ("checksum mismatch"), was written by a newer version, or ``like`` differs from it
            (the error names the field and both values).

    Examples:
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
        >>> three = (jnp.eye(2)[jnp.array([0, 1, 1])], jnp.zeros((3, 1)))   # the same shapes, but 3 examples
        >>> pst.load(path, eqx.filter_eval_shape(pst.laplace, fn, jnp.zeros(2), three, Gaussian(1.0), structure="diag"))
        Traceback (most recent call last):
        ...
        ValueError: load: ... in its static fields: .num_examples is 2 in the file and 3 in ...
    """
    who = "load"
    _check_posterior(like, who, "like")
    expected = _describe(like, who, template=True)
    with open(Path(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        line, header = _read_header(f, path, size)
        if header["format"] == 1:
            raise ValueError(f"load: {path} has file format 1 (posteriors before its first release: no checksum, "
                             f"no static fields), which this version does not read; it reads format {_FORMAT}. Fit "
                             "the posterior again and save it")
        if header["format"] != _FORMAT:
            raise ValueError(f"load: {path} was written by a newer version of posteriors (file format "
                             f"{header['format']}; this version reads format {_FORMAT}): upgrade posteriors")
        _check_integrity(f, path, line, size, header)
        _compare(path, header, expected)
        f.seek(len(line))
        return _read_leaves(f, header, like)


__all__ = ["load", "save"]
