"""The layout the architecture promises: an acyclic linops (deferred imports counted), the algebra never
importing linops.nn, short modules and classes, and no factorisation written in the Laplace code of posteriors."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINOPS = ROOT / "linops"


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of ``modules`` that ``name`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# What each layer's folder may import besides itself (the public modules at the root are the algebra's API:
# closed_forms, memory, tags; likelihoods and models are the network operators').
LAYERS = {
    "linops.algebra": {"linops.closed_forms", "linops.memory", "linops.tags"},
    "linops.runtime": set(),
    "linops.numerics": {"linops.algebra", "linops.closed_forms", "linops.memory", "linops.runtime"},
    "linops.interop": {"linops.algebra", "linops.closed_forms", "linops.tags"},
}


def _layer_violations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    out = {}
    for layer, allowed in LAYERS.items():
        for m, deps in graph.items():
            if m == layer or m.startswith(layer + "."):
                bad = sorted(d for d in deps if not (d == layer or d.startswith(layer + ".") or d == "linops"
                                                     or any(d == a or d.startswith(a + ".") for a in allowed)))
                if bad:
                    out[m] = bad
    return out


def test_the_layer_check_finds_planted_imports():
    graph = {"linops.algebra._base": {"linops.algebra._tags", "linops.runtime._progress"},
             "linops.algebra._leaves": {"linops.nn._operators", "linops.memory"},
             "linops.numerics._lanczos": {"linops.algebra._base", "linops.runtime._progress"}}
    assert _layer_violations(graph) == {"linops.algebra._base": ["linops.runtime._progress"],
                                        "linops.algebra._leaves": ["linops.nn._operators"]}


def test_linops_has_no_import_cycle_and_each_layer_imports_only_the_layers_below():
    """The algebra imports neither the runtime, the numerics, the kernels nor the network operators; the runtime
    imports nothing of linops; no cycle, deferred imports included."""
    modules = _modules(LINOPS)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []
    assert {layer for layer in LAYERS if layer in modules} == set(LAYERS)
    assert _layer_violations(graph) == {}


@pytest.mark.parametrize("path", sorted(LINOPS.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_linops_modules_and_classes_stay_short(path):
    tree = ast.parse(path.read_text())
    assert len(path.read_text().splitlines()) <= 500
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > 250}
    assert not long


LIBRARY_CODE = sorted(p.name for p in (ROOT / "posteriors").glob("*.py"))


@pytest.mark.parametrize("name", LIBRARY_CODE)
def test_the_posteriors_write_no_factorisation(name):
    """Cholesky, eigendecompositions, SVDs, solves: linops does them (`lo.factorize`, `lo.eigendecompose`, `lo.svd`,
    `lo.inv`), in every library module of posteriors (the FSP-Laplace algorithm included)."""
    calls = []
    for node in ast.walk(ast.parse((ROOT / "posteriors" / name).read_text())):
        if isinstance(node, ast.Attribute):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                chain.append(inner.id)
            dotted = ".".join(reversed(chain))
            if any(p in dotted for p in ("linalg.", "scipy.linalg", "jsl.")):
                calls.append(dotted)
    assert not calls


POSTERIORS = ROOT / "posteriors"


def _private_linops_imports(source: str) -> list[str]:
    """The private linops modules and names ``source`` imports: a dotted path with a part that starts with an
    underscore (``linops._batching``, ``linops.nn._kfac``) or a private name taken from linops
    (``from linops import _tags``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "linops":
            paths = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found += [p for p in paths if any(part.startswith("_") for part in p.split("."))][:1]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.split(".")[0] == "linops" and any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_the_private_import_check_finds_planted_ones():
    planted = "from linops._batching import batched_map\nimport linops.nn._kfac\nfrom linops import _tags\n"
    assert _private_linops_imports(planted) == ["linops._batching", "linops.nn._kfac", "linops._tags"]
    clean = "import linops as lo\nfrom linops.runtime import program\nfrom linops.nn.layers import trace_layers\n"
    assert _private_linops_imports(clean) == []
    assert _private_linops_imports("from ._checks import check_data\nimport jax._src\n") == []


@pytest.mark.parametrize("path", sorted(POSTERIORS.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_posteriors_use_linops_public_names_only(path):
    """posteriors builds on linops as a user would: `linops.runtime` for compiling, batching and progress,
    `linops.nn.layers` for per-layer rules; never a private module."""
    assert _private_linops_imports(path.read_text()) == []


def test_the_runtime_is_the_bottom_layer():
    """`linops.runtime` (compiling, streaming over examples, progress bars) imports no other part of linops."""
    modules = _modules(LINOPS)
    runtime = {name: _imports(name, path, modules) for name, path in modules.items()
               if name.startswith("linops.runtime")}
    assert runtime, "linops.runtime not found"
    assert not {m: sorted(d for d in deps if not d.startswith("linops.runtime")) for m, deps in runtime.items()
                if any(not d.startswith("linops.runtime") for d in deps)}


# A public module that presents one private module under its public name: the only re-exports allowed
# outside a package's __init__.
FACADES = {"linops/tags.py": "linops.algebra._tags"}


def _reexports(source: str) -> list[str]:
    """The names of a module's ``__all__`` that it imports from another module instead of defining."""
    tree = ast.parse(source)
    listed, defined, imported = [], set(), set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
                    if target.id == "__all__":
                        listed = [e.value for e in node.value.elts]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    noqa = [line.strip() for line in source.splitlines() if "import" in line and "noqa: F401" in line]
    return [n for n in listed if n in imported and n not in defined] + noqa


def test_the_reexport_check_finds_planted_ones():
    planted = ("from ._products import Product\nfrom .x import y  # noqa: F401\n"
               "def f(): ...\n__all__ = ['Product', 'f']\n")
    assert _reexports(planted) == ["Product", "from .x import y  # noqa: F401"]
    assert _reexports("import numpy as np\ndef f(): ...\n__all__ = ['f']\n") == []


@pytest.mark.parametrize("path", sorted(p for root in (LINOPS, POSTERIORS) for p in root.rglob("*.py")
                                        if p.name != "__init__.py"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reexports_another_modules_names(path):
    """A name lives in one module: outside a package's ``__init__`` (and the public facades of `FACADES`), no
    module lists in ``__all__``, or keeps as an unused import, a name it imports from another."""
    if str(path.relative_to(ROOT)) in FACADES:
        return
    assert _reexports(path.read_text()) == []


def test_the_abstract_bases_cannot_be_instantiated():
    """The classes users extend are abstract: a subclass that forgets what it must define fails when built, naming
    the missing methods, not at its first product."""
    import linops as lo
    import posteriors as pst
    from posteriors import _structures as S

    for build in (lo.LinearOperator, S.StructuredGGN, pst.weights.Weights,
                  lambda: pst.GaussianPosterior(lambda p, x: x, None, None)):
        with pytest.raises(TypeError, match="abstract"):
            build()

    class Forgetful(lo.LinearOperator):
        @property
        def shape(self):
            return (2, 2)

        @property
        def dtype(self):
            return float

    with pytest.raises(TypeError, match="mv"):
        Forgetful()


_OLD_HOOKS = {f"_{name}" for name in ("diag", "solve", "inv", "pinv", "sqrt", "logdet", "eigh", "trace", "root",
                                      "factorize", "eigendecompose", "eigvalsh", "shift", "hadamard_square",
                                      "woodbury_part", "svd")}


def test_closed_forms_are_registered_never_methods():
    """`linops.closed_forms` is the one way to give a closed form: no operator class defines an underscore hook
    (``_diag``, ``_solve``, ...) that a function would have to know about, and every table's rules are
    listed by the table."""
    import linops as lo

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    hooks = sorted(f"{c.__name__}.{name}" for c in subclasses(lo.LinearOperator)
                   for name in vars(c) if name in _OLD_HOOKS)
    assert hooks == []
    assert {f"_{f.name}" for f in lo.closed_forms.FUNCTIONS} == _OLD_HOOKS
    where = {c.__name__ for c, _ in lo.closed_forms.solve.rules()}
    assert {"LinearOperator", "Dense", "Kronecker", "Sum", "Lowered"} <= where


def _is_abstract(cls) -> bool:
    import inspect

    return inspect.isabstract(cls) or bool(getattr(cls, "__abstractvars__", None)) or cls.__name__.startswith("_")


def test_concrete_classes_are_final():
    """Equinox's abstract/final discipline: a class the library builds is never the base of another one (what two
    classes share lives in an abstract base: `AbstractLowRank` for `LowRank` and `LanczosLowRankOp`,
    `AbstractLowRankPosterior` for `LowRankPosterior` and `FSPLaplacePosterior`). Private bases (``_Pair``) count
    as abstract: users never build them."""
    import linops as lo
    import posteriors as pst
    from posteriors import _structures, fsp, projected, swag_posterior  # noqa: F401  (their classes register)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    roots = (lo.LinearOperator, pst.GaussianPosterior, _structures.StructuredGGN, pst.weights.Weights,
             lo.kernels.Kernel)
    inherited = sorted(f"{c.__name__}({b.__name__})" for root in roots for c in subclasses(root)
                       if c.__module__.startswith(("linops", "posteriors"))
                       for b in c.__bases__ if b not in roots and issubclass(b, root) and not _is_abstract(b))
    assert inherited == []
    # the check can fail: the predicate tells the abstract bases from the concrete classes
    assert [_is_abstract(c) for c in (lo.AbstractLowRank, lo.LowRank, pst.AbstractLowRankPosterior,
                                      pst.LowRankPosterior, lo.kernels.RBF)] == [True, False, True, False, False]


def _application_imports(modules: dict[str, Path]) -> dict[str, list[str]]:
    apps = "posteriors.experiments"
    out = {}
    for name, path in modules.items():
        if name == apps or name.startswith(apps + ".") or name == "posteriors.__main__":
            continue
        found = sorted(m for m in _imports(name, path, modules) if m == apps or m.startswith(apps + "."))
        if found:
            out[name] = found
    return out


def test_the_library_never_imports_the_applications(tmp_path):
    """The command line and the experiments (`posteriors.experiments`, with `python -m posteriors` in its `cli`)
    are an application of the library: no library module imports them, so the library's behaviour never depends
    on an experiment's settings."""
    modules = _modules(ROOT / "posteriors")
    assert "posteriors.experiments.cli" in modules
    assert _application_imports(modules) == {}
    planted = tmp_path / "planted.py"  # the check can fail: a deferred import inside a function is found
    planted.write_text("def f():\n    from posteriors.experiments.methods import METHODS\n    return METHODS\n")
    assert _application_imports({**modules, "posteriors.planted": planted}) == {
        "posteriors.planted": ["posteriors.experiments.methods"]}


def test_the_lazy_names_of_posteriors_match_its_static_imports():
    """`posteriors/__init__.py` keeps its public names in `_HOMES` (loaded on first use, so `python -m posteriors
    --help` never imports JAX) and, for type checkers and the API pages, as static imports under TYPE_CHECKING:
    the two lists must agree."""
    import posteriors as pst

    tree = ast.parse((ROOT / "posteriors" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    static = {(node.module, a.name) for node in ast.walk(block) if isinstance(node, ast.ImportFrom)
              for a in node.names}
    lazy = {(module, name) for module, names in pst._HOMES.items() for name in names}
    lazy |= {("posteriors", name) for name in pst._SUBMODULES}
    assert static == lazy
    assert sorted(pst.__all__) == sorted(name for _, name in lazy)
