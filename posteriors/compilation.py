"""JAX's persistent compilation cache, switched on by the user (never at import).

Within a process, every public call of `posteriors` compiles once per model, shapes and options; between
processes XLA compiles again unless its programs are written to disk and read back.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "linops" / "jax"
"""Where `python -m posteriors` keeps compiled programs by default."""


def use_compilation_cache(directory=DEFAULT_CACHE) -> Path | None:
    """Switch on JAX's persistent compilation cache in ``directory`` (``None`` or ``"none"``: leave it off).

    A second run of the same script reads its compiled programs back instead of compiling them again.
    `python -m posteriors` calls it before any work (``--compilation-cache``). The library itself never
    sets it (no global configuration at import): call this, or
    ``jax.config.update("jax_compilation_cache_dir", ...)``, at the top of your own script. Programs that
    compiled in under 0.1 s are not written. Returns the directory used, or None.

    JAX keys a program that calls back to the host by the callback's address in this process, so such a
    program is never read back by another process: a progress bar is such a callback. Pass
    ``progress=False`` to the fits and predictives whose programs should be cached between runs (the
    speed guide, "Between processes", has the measurement).

    Examples:
        >>> import posteriors as pst
        >>> pst.use_compilation_cache("none") is None
        True
    """
    if directory is None or str(directory).lower() == "none":
        return None
    import jax

    path = Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    return path


__all__ = ["DEFAULT_CACHE", "use_compilation_cache"]
