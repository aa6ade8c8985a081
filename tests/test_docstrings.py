"""Every public name has a docstring with a runnable example, and every example runs."""

import inspect
import subprocess
import sys
import textwrap

import pytest

import linops as lo
import linops.kernels
import linops.likelihoods
import linops.memory
import linops.models
import linops.nn.layers
import linops.runtime
import linops.testing
import linops.testing.strategies
import posteriors
import posteriors.data
import posteriors.experiments.cli
import posteriors.weights


def _all_modules():
    """Every module of both packages (a new module's examples run without being listed here); the
    experiments and the command-line entry point are run by their own tests."""
    import pkgutil

    names = ["linops", "posteriors"]
    for package in (lo, posteriors):
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return [n for n in names if not n.startswith("posteriors.experiments") and not n.endswith("__main__")]


_MODULES = _all_modules()


def _public(module):
    return [(name, getattr(module, name)) for name in module.__all__]


def test_every_public_name_has_a_runnable_example():
    missing = []
    objects = _public(lo) + _public(linops.testing) + _public(linops.testing.strategies)
    objects += _public(linops.likelihoods) + _public(linops.models) + _public(linops.memory)
    objects += _public(linops.kernels) + _public(linops.nn.layers) + _public(linops.runtime)
    objects += _public(posteriors) + _public(posteriors.predictive) + _public(posteriors.subnetwork)
    objects += _public(posteriors.metrics) + _public(posteriors.data) + _public(posteriors.experiments.cli)
    objects += _public(posteriors.weights)
    for name, obj in objects:
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if ">>>" not in doc and name not in _EXAMPLE_IN_MODULE_DOC:
            missing.append(name)
    assert not missing, f"public names without a docstring example: {missing}"


# Internal node types users rarely build by hand: their examples live in the module docs
# and in the operators that create them (A + B, A @ B, c * A, A.T, lo.inv, lo.lower).
_EXAMPLE_IN_MODULE_DOC = {
    "Sum", "Product", "Scaled", "Transpose", "Inverse", "Lowered", "Solution", "Estimate",
    "NoReduction", "Case", "Likelihood", "Projection", "ProjectedPosterior", "Lanczos", "GPFit",
    "GaussianPosterior", "FSPInfo", "FSPLaplacePosterior", "LaplacePosterior", "KFAC", "Subnetwork", "Layer",
}


# Two interpreters, each running half of the modules' examples (about 50 s in all on 2 cores): one test of
# them all ran last on one worker of the default suite while the other sat idle.
_CHUNKS = 2


@pytest.mark.parametrize("chunk", range(_CHUNKS))
def test_docstring_examples_run(chunk):
    """Run the doctests in a fresh interpreter, in JAX's default float32 mode."""
    modules = _MODULES[chunk::_CHUNKS]
    code = textwrap.dedent(
        f"""
        import doctest, importlib, sys
        failed = 0
        for name in {modules!r}:
            module = importlib.import_module(name)
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            failed += result.failed
        sys.exit(1 if failed else 0)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
