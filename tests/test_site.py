"""The built documentation site as a reader meets it: every docstring example of the API reference is
highlighted code (not prose), the math renderer is served with the site (it reads offline), and code
blocks carry a copy button. Builds the site with mkdocs; skipped where the docs extra is not installed
(CI installs it and runs this file after the build)."""

import html.parser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("material")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


_VOID = {"area", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}


class _Prompts(html.parser.HTMLParser):
    """The ``>>>`` prompts outside highlighted code (a ``<code>`` in an element of class ``highlight``), and
    the number of blockquotes."""

    def __init__(self):
        super().__init__()
        self.stack, self.outside, self.blockquotes = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag not in _VOID:
            self.stack.append((tag, "highlight" in (dict(attrs).get("class") or "").split()))
        self.blockquotes += tag == "blockquote"

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        in_code = any(h for _, h in self.stack) and any(t == "code" for t, _ in self.stack)
        if ">>>" in data and not in_code:
            self.outside.append(data.strip()[:80])


def _api_pages(site):
    pages = sorted((site / "api").glob("*/index.html"))
    assert len(pages) >= 10
    return pages


def test_every_api_example_is_highlighted_code(site):
    """No example is prose: every ``>>>`` of the API pages sits in a highlighted ``pycon`` block, no page
    has a blockquote (how ``>>>`` lines read as Markdown), and the examples are all there."""
    blocks = 0
    for page in _api_pages(site):
        text = page.read_text()
        parser = _Prompts()
        parser.feed(text)
        assert not parser.outside, f"{page.parent.name}: prompts outside code: {parser.outside[:3]}"
        assert parser.blockquotes == 0, f"{page.parent.name}: {parser.blockquotes} blockquotes"
        blocks += text.count('class="language-pycon highlight"')
    import linops
    import posteriors

    # every public name has an example (tests/test_docstrings.py); most are on these pages
    assert blocks >= len(linops.__all__) + len(posteriors.__all__), blocks


def test_code_blocks_can_be_copied(site):
    """The theme's copy button is on, and the prompts and output are not selected with the code."""
    page = (site / "api" / "operators" / "index.html").read_text()
    config = json.loads(re.search(r'<script id="__config" type="application/json">(.*?)</script>', page, re.S)[1])
    assert "content.code.copy" in config["features"]
    css = (site / "stylesheets" / "extra.css").read_text()
    assert ".highlight .gp" in css and "user-select: none" in css


def test_math_renders_offline(site):
    """Every script a page loads is served with the site (none from a CDN), MathJax among them, and the
    pages with math mark it for MathJax."""
    loaded = set()
    for page in site.rglob("*.html"):
        for src in re.findall(r'<script[^>]*\ssrc="([^"]+)"', page.read_text()):
            assert not re.match(r"(https?:)?//", src), f"{page.relative_to(site)} loads {src} from the network"
            loaded.add((page.parent / src).resolve())
    mathjax = (site / "javascripts" / "mathjax" / "tex-svg-full.js").resolve()
    assert mathjax in loaded and mathjax.stat().st_size > 500_000
    assert 'class="arithmatex"' in (site / "methods" / "laplace" / "index.html").read_text()
