"""Run every code example in the docs: ``python docs/check_examples.py [page.md ...]``.

Also checks that the API reference (``docs/api/*.md``) renders every public name of the
public modules (``PUBLIC_MODULES``), and that every figure on a method page
(``docs/methods/*.md``) is one that a notebook in ``notebooks/`` writes.

Each page runs in a fresh interpreter (so a rule registered on one page does not leak
into the next), its blocks in order and in one namespace, as a reader would type them:

- a ```` ```python ```` block is executed and must not raise;
- a ```` ```pycon ```` block (``>>>`` prompts) is run by doctest (``ELLIPSIS`` and
  ``NORMALIZE_WHITESPACE``): the printed outputs shown in the docs must match.

JAX runs in its default float32 mode, as a user's would. Exit status 1 if any page fails.
This file is excluded from the site (``exclude_docs`` in ``mkdocs.yml``).
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parent
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>python|pycon)\b[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)

RUNNER = r"""
import doctest, sys, traceback
try:  # the same Hypothesis draws on every run: a docs check must not be flaky
    from hypothesis import settings
    settings.register_profile("docs", derandomize=True)
    settings.load_profile("docs")
except ImportError:
    pass
blocks = {blocks!r}
page = {page!r}
globs = {{"__name__": "__main__"}}
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
failed = 0
for i, (lang, line, body) in enumerate(blocks):
    where = f"{{page}}:{{line}}"
    if lang == "python":
        try:
            exec(compile(body, where, "exec"), globs)
        except Exception:
            failed += 1
            print(f"FAILED {{where}} (python block)")
            traceback.print_exc()
    else:
        test = doctest.DocTestParser().get_doctest(body, globs, where, page, line)
        runner = doctest.DocTestRunner(optionflags=flags)
        runner.run(test, out=sys.stdout.write, clear_globs=False)
        globs.update(test.globs)  # DocTest works on a copy of the namespace
        if runner.failures:
            failed += 1
            print(f"FAILED {{where}} (pycon block)")
sys.exit(1 if failed else 0)
"""


def blocks_of(path: Path) -> list[tuple[str, int, str]]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        out.append((m["lang"], line, textwrap.dedent(m["body"])))
    return out


def check(path: Path) -> tuple[bool, str]:
    """Whether the page's examples run, and what to print about it."""
    blocks = blocks_of(path)
    if not blocks:
        return True, ""
    code = RUNNER.format(blocks=blocks, page=str(path.relative_to(DOCS.parent)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    ok = proc.returncode == 0
    report = f"{'ok  ' if ok else 'FAIL'} {path.relative_to(DOCS)}: {len(blocks)} blocks"
    return ok, report if ok else "\n".join([report, proc.stdout[-8000:], proc.stderr[-4000:]])


# Pages run two at a time, each in its own interpreter (its output printed in page order): one interpreter
# compiles on one core, and CI's machine has two. One at a time, the pages took about 7 minutes of CI's hour.
WORKERS = 2


# Every public name of these modules must appear in the API reference, as its own ``::: module.name`` entry or
# rendered by a ``::: module`` entry (all its public names, or those listed under ``options: members:``).
PUBLIC_MODULES = ("linops", "linops.testing", "linops.testing.strategies", "linops.kernels", "linops.likelihoods",
                  "linops.models", "linops.memory", "linops.tags", "posteriors", "posteriors.data",
                  "posteriors.metrics", "posteriors.predictive", "posteriors.subnetwork", "posteriors.context",
                  "posteriors.swag_posterior", "posteriors.ensemble",
                  "posteriors.experiments.cli")


def api_entries() -> dict[str, set[str] | None]:
    """``{documented object: members it renders (None: all of them)}`` from ``docs/api/*.md``."""
    entries: dict[str, set[str] | None] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for m in re.finditer(r"^::: ([\w.]+)[ \t]*\n((?:[ \t]+\S.*\n?)*)", page.read_text(), re.M):
            options = m[2]
            members = set(re.findall(r"^[ \t]+- (\w+)", options, re.M)) if "members:" in options else None
            entries[m[1]] = members
    return entries


def _resolve(path: str):
    """The object a dotted path names (a module, or an attribute of one), or ``None``."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def check_api_coverage() -> bool:
    import importlib

    entries = api_entries()
    rendered = set()  # ids of every object the reference renders (a re-exported name counts once)
    for path, members in entries.items():
        obj = _resolve(path)
        rendered.add(id(obj))
        if isinstance(obj, type(importlib)):
            names = getattr(obj, "__all__", []) if members is None else members
            rendered |= {id(getattr(obj, n, None)) for n in names}
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            if id(getattr(module, name)) not in rendered:
                missing.append(f"{module_name}.{name}")
    print(f"{'ok  ' if not missing else 'FAIL'} API reference covers the public names of {len(PUBLIC_MODULES)} "
          f"modules" + (f": missing {missing}" if missing else ""))
    return not missing


def check_method_figures() -> bool:
    """Every figure on a method page is written by a notebook (a literal file name in ``notebooks/*.py``)."""
    notebooks = {p.name: p.read_text() for p in sorted((DOCS.parent / "notebooks").glob("*.py"))}
    problems = []
    for page in sorted((DOCS / "methods").glob("*.md")):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            name = Path(target).name
            if not target.startswith("../figures/notebooks/"):
                problems.append(f"{page.name}: {target} is not under figures/notebooks/")
            elif not any(f'"{name}"' in text for text in notebooks.values()):
                problems.append(f"{page.name}: no notebook writes {name}")
            elif not (DOCS / "figures" / "notebooks" / name).exists():
                problems.append(f"{page.name}: {name} is missing (run the notebook that writes it)")
    print(f"{'ok  ' if not problems else 'FAIL'} method-page figures come from the notebooks"
          + (f": {problems}" if problems else ""))
    return not problems


def main(argv: list[str]) -> int:
    pages = [Path(a).resolve() for a in argv] or sorted(DOCS.rglob("*.md"))
    results = []
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        for ok, report in pool.map(check, pages):
            if report:
                print(report, flush=True)
            results.append(ok)
    if not argv:
        results.append(check_api_coverage())
        results.append(check_method_figures())
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
