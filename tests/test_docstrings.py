"""Every public name has a docstring with a runnable example, and every example runs."""

import inspect
import subprocess
import sys
import textwrap

import linops as lo
import linops.kernels
import linops.likelihoods
import linops.memory
import linops.models
import linops.testing
import linops.testing.strategies
import posteriors
import posteriors.cli
import posteriors.data

_MODULES = [
    "linops", "linops.tags", "linops._base", "linops._leaves", "linops._structured", "linops._composite",
    "linops._functions", "linops._projector", "linops._rules", "linops._lower", "linops._lineax",
    "linops.testing", "linops.testing.strategies", "linops.likelihoods", "linops.models", "linops._nn",
    "linops._streaming", "linops.memory", "linops._alternating", "linops._lanczos",
    "linops.kernels", "linops.kernels._base", "linops.kernels._stationary", "linops.kernels._basic",
    "linops.kernels._combine", "linops.kernels._multioutput", "linops.kernels._gram", "linops.kernels._gp",
    "posteriors", "posteriors.projected", "posteriors.context", "posteriors.gaussian", "posteriors.fsp",
    "posteriors.laplace_family", "posteriors.predictive", "posteriors.marglik", "posteriors.io", "linops._kfac",
    "posteriors.subnetwork", "posteriors.metrics", "posteriors.data", "posteriors.cli",
]


def _public(module):
    return [(name, getattr(module, name)) for name in module.__all__]


def test_every_public_name_has_a_runnable_example():
    missing = []
    objects = _public(lo) + _public(linops.testing) + _public(linops.testing.strategies)
    objects += _public(linops.likelihoods) + _public(linops.models) + _public(linops.memory)
    objects += _public(linops.kernels)
    objects += _public(posteriors) + _public(posteriors.predictive) + _public(posteriors.subnetwork)
    objects += _public(posteriors.metrics) + _public(posteriors.data) + _public(posteriors.cli)
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
    "GaussianPosterior", "FSPInfo", "FSPLaplacePosterior", "LaplacePosterior", "KFAC", "Subnetwork",
}


def test_docstring_examples_run():
    """Run the doctests in a fresh interpreter, in JAX's default float32 mode."""
    code = textwrap.dedent(
        f"""
        import doctest, importlib, sys
        failed = 0
        for name in {_MODULES!r}:
            module = importlib.import_module(name)
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            failed += result.failed
        sys.exit(1 if failed else 0)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
