"""Run every code example in the docs: ``python docs/check_examples.py [page.md ...]``.

Also checks that the API reference (``docs/api/*.md``) has a ``::: linops.X`` entry for
every name in ``linops.__all__`` and entries for ``linops.testing`` and
``linops.testing.strategies`` (whose module entries render all their public names).

Each page runs in a fresh interpreter (so a rule registered on one page does not leak
into the next), its blocks in order and in one namespace, as a reader would type them:

- a ```` ```python ```` block is executed and must not raise;
- a ```` ```pycon ```` block (``>>>`` prompts) is run by doctest (``ELLIPSIS`` and
  ``NORMALIZE_WHITESPACE``): the printed outputs shown in the docs must match.

JAX runs in its default float32 mode, as a user's would. Exit status 1 if any page fails.
This file is excluded from the site (``exclude_docs`` in ``mkdocs.yml``).
"""

from __future__ import annotations

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


def check(path: Path) -> bool:
    blocks = blocks_of(path)
    if not blocks:
        return True
    code = RUNNER.format(blocks=blocks, page=str(path.relative_to(DOCS.parent)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    ok = proc.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {path.relative_to(DOCS)}: {len(blocks)} blocks")
    if not ok:
        print(proc.stdout[-8000:], proc.stderr[-4000:], sep="\n")
    return ok


def check_api_coverage() -> bool:
    import linops

    entries = set()
    for page in sorted((DOCS / "api").glob("*.md")):
        entries |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    wanted = {f"linops.{name}" for name in linops.__all__} | {"linops.testing", "linops.testing.strategies"}
    missing = sorted(wanted - entries)
    print(
        f"{'ok  ' if not missing else 'FAIL'} API reference covers linops.__all__, linops.testing, "
        f"linops.testing.strategies" + (f": missing {missing}" if missing else "")
    )
    return not missing


def main(argv: list[str]) -> int:
    pages = [Path(a).resolve() for a in argv] or sorted(DOCS.rglob("*.md"))
    results = [check(p) for p in pages]
    if not argv:
        results.append(check_api_coverage())
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
