"""The built documentation site as a reader meets it: every docstring example of the API reference is
highlighted code (not prose), the math renderer is served with the site (it reads offline), code
blocks carry a copy button, no text is lost to Markdown's traps (brace groups, lists after nested
blocks), every figure opens at full size, every paper's results page has a verdict for each of its tables and
figures, and (in headless Chromium) every column shows at 1280 px and on a phone.
Builds the site with mkdocs; skipped where the docs extra is not installed (CI installs it and runs this
file after the build)."""

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


# --- what a reader of the results meets: nothing lost to Markdown, figures at full size, every column shown ---


def _page_of(site, source):
    """The built page of a ``docs/`` source file."""
    rel = source.relative_to(ROOT / "docs").with_suffix("")
    return site / ("" if rel.name == "index" and rel.parent == Path(".") else str(rel)) / "index.html"


def _prose(markdown):
    """``markdown`` without code (fenced, indented, inline), math and HTML comments."""
    text = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.M)  # indented code (and deeply nested list text)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$|\\\(.*?\\\)", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def _visible_text(html):
    return __import__("html").unescape(re.sub(r"<[^>]+>", "", html))


def test_no_braces_are_eaten_by_attribute_lists(site):
    """A ``{...}`` of a page's prose shows on the built page. ``attr_list`` takes a brace group that ends a block
    (a table cell, a paragraph) as the block's attributes and drops it: "grid search over {0.1, 1, 5}" rendered as
    "grid search over". Escaping the braces (``\\{...\\}``) keeps them. Groups written as attributes (``{#id}``,
    ``{.class}``, ``{key=value}``) are skipped."""
    lost, checked = [], 0
    for source in sorted((ROOT / "docs").rglob("*.md")):
        built = _page_of(site, source)
        if not built.exists():
            continue
        shown = re.sub(r"\s+", " ", _visible_text(built.read_text()))
        for group in re.findall(r"\\?\{[^{}\n]*?\\?\}", _prose(source.read_text())):
            text = re.sub(r"\s+", " ", group.replace("\\{", "{").replace("\\}", "}"))
            if re.fullmatch(r"\{:?\s*([#.][\w-]+|\w+=\S+)(\s+([#.][\w-]+|\w+=\S+))*\s*\}", text):
                continue  # meant as attributes (an anchor such as {#costs}, a class)
            checked += 1
            if text not in shown:
                lost.append(f"{source.relative_to(ROOT)}: {text}")
    assert checked > 0
    assert not lost, f"brace groups missing from the built pages: {lost}"


def test_list_items_after_a_nested_block_stay_list_items(site):
    """No bullet renders as running text. A list item's nested table or paragraph indented by two spaces (Python-
    Markdown wants four) ends the list: the following items became one paragraph with literal "- **" in it."""
    bad = []
    for page in sorted(site.rglob("index.html")):
        text = re.sub(r"<pre.*?</pre>|<code.*?</code>|<script.*?</script>", "", page.read_text(), flags=re.S)
        for paragraph in re.findall(r"<p>(.*?)</p>", text, flags=re.S):
            if re.search(r"(^|\n)\s*[-*] (<strong>|\w)", paragraph):
                bad.append(f"{page.relative_to(site).parent}: {_visible_text(paragraph)[:80]!r}")
    assert not bad, f"list items rendered as running text: {bad}"


def test_every_figure_opens_at_full_size(site):
    """Every image of the content is a link to its own file (``docs/hooks/figures.py``), and every figure in
    ``docs/figures`` (the results' and the notebooks') is shown on some page."""
    shown = set()
    for page in sorted(site.rglob("index.html")):
        html = page.read_text()
        content = html[html.find('<article'):html.find('</article>')]
        for match in re.finditer(r"<img\b[^>]*>", content):
            src = re.search(r'src="([^"]+)"', match[0])[1]
            before = content[:match.start()]
            assert before.rfind("<a ") > before.rfind("</a>"), f"{page.relative_to(site).parent}: {src} is not a link"
            assert before[before.rfind("<a "):].startswith(f'<a class="figure-link" href="{src}"'), src
            shown.add((page.parent / src).resolve().relative_to(site.resolve()).as_posix())
    figures = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs" / "figures").rglob("*.png")}
    assert not figures - shown, f"figures never shown: {sorted(figures - shown)}"


# Every numbered table and figure of each paper (its text read by hand: the papers are not in the repository),
# with the lemmas the paper states as results. Each must be named in the claim column of its page's verdicts.
PAPER_ITEMS = {
    "projected": ["Figure 1", "Table 1", "Figures 2 and 3", "Figure 4", "Table 2", "Table 3", "Table 4", "Figure 5",
                  "Table 5", "Figure 6", "Figure 7", "Lemma 3.1", "Lemma 3.2", "Theorem 3.3", "Lemma 3.4",
                  "Lemma 4.1", "Lemma 4.3"],
    "subnetwork": ["Figure 1", "Figure 2", "Figure 3", "Figure 4", "Figure 5", "Figure 6", "Figure 7", "Figure 8",
                   "Figure 9", "Table 1", "tables 2–14", "tables 15–20", "Tables 21–23"],
    "fsp": ["Figure 1", "Figure 2", "Table 1", "Figure 3", "Table 2", "C.3", "C.4", "C.5", "C.6", "C.7", "C.8", "C.9",
            "C.10", "C.11", "Table C.1", "Table C.2"],
}
VERDICTS = ("**reproduced**", "**not reproduced**", "not run", "no claim")


def _verdict_rows(page: str) -> list[list[str]]:
    """The rows of the first table under ``## Verdicts`` of ``docs/results/<page>.md``, as cells."""
    text = (ROOT / "docs" / "results" / f"{page}.md").read_text()
    assert "\n## Verdicts\n" in text, f"docs/results/{page}.md has no Verdicts section"
    lines = text.split("\n## Verdicts\n", 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert [c.strip() for c in table[0].strip("|").split("|")] == ["claim", "the paper", "ours", "verdict", "reason"]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table[2:]]


@pytest.mark.parametrize("page", sorted(PAPER_ITEMS))
def test_every_claim_of_a_paper_has_a_verdict(page):
    """Each paper's results page opens with a verdict table (claim, the paper, ours, verdict, reason) that names
    every table and figure of the paper; every row's verdict is one of the four words, a measured row links to the
    command's section, and every row that is not a plain reproduction says why."""
    rows = _verdict_rows(page)
    claims = " ".join(r[0] for r in rows)
    missing = [item for item in PAPER_ITEMS[page] if item not in claims]
    assert not missing, f"docs/results/{page}.md: no verdict for {missing}"
    for claim, _, ours, verdict, reason in rows:
        assert verdict.startswith(VERDICTS), (claim, verdict)
        if "reproduced" in verdict:
            assert "](" in ours or "`tests/" in ours or "`python " in ours or "`docs/" in ours, (
                f"{claim}: a measured verdict names where its numbers come from")
        if verdict.startswith(("**not reproduced**", "not run")) or " not " in verdict or "part" in verdict:
            assert reason, f"{claim}: {verdict} without a reason"


def _kind(verdict: str) -> str:
    return next(v for v in VERDICTS if verdict.startswith(v)).strip("*")


def test_the_results_index_counts_each_pages_verdicts():
    """The index's table of counts (rows, reproduced, not reproduced, not run, no claim) is each page's."""
    text = (ROOT / "docs" / "results" / "index.md").read_text()
    counted = {}
    for line in text.splitlines():
        if match := re.match(r"\|[^|]*\| \[[^\]]*\]\((\w+)\.md\) \|(.*)\|$", line):
            counted[match[1]] = [int(c) for c in match[2].split("|")]
    assert set(counted) == set(PAPER_ITEMS)
    for page, numbers in counted.items():
        kinds = [_kind(r[3]) for r in _verdict_rows(page)]
        assert numbers == [len(kinds)] + [kinds.count(k.strip("*")) for k in VERDICTS], page


def _chromium():
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
        if Path(path).exists():
            return path
    return None


_OVERFLOW = """() => {
  const wide = [];
  for (const w of document.querySelectorAll('.md-typeset__scrollwrap, .md-typeset__table'))
    if (w.scrollWidth > w.clientWidth + 2) wide.push('table: ' + (w.innerText || '').slice(0, 50));
  for (const c of document.querySelectorAll('.md-content pre > code'))
    if (c.scrollWidth > c.clientWidth + 2) wide.push('code: ' + c.innerText.slice(0, 50));
  return wide;
}"""


@pytest.mark.parametrize("width", [1280, 390])
def test_every_column_and_code_line_shows(site, width):
    """In headless Chromium at 1280 x 900 px (a laptop) and at 390 x 844 px (a phone), no table and no code block of
    any page is wider than the content column (nothing hides behind a horizontal scroll bar): on the phone each
    table row is a card of labelled cells (``docs/hooks/tables.py``). Needs Chromium and ``playwright`` (skipped
    without: ``apt-get install chromium``, ``pip install playwright``); ``.ci/run`` installs both where it can."""
    sync_api = pytest.importorskip("playwright.sync_api")
    browser_path = _chromium()
    if browser_path is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = sorted(p.relative_to(site).parent.as_posix() for p in site.rglob("index.html"))
    assert len(pages) > 30
    wide = {}
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync"])
            tab = browser.new_page(viewport={"width": width, "height": 900 if width > 1000 else 844})
            for page in pages:
                tab.goto(f"http://127.0.0.1:{server.server_address[1]}/{'' if page == '.' else page + '/'}")
                if found := tab.evaluate(_OVERFLOW):
                    wide[page] = found
            browser.close()
    finally:
        server.shutdown()
    assert not wide, f"wider than the content column at {width} px: {wide}"


def test_table_cells_carry_their_column_names(site):
    """Every body cell of a results table names its column (``data-label``, which the phone layout shows)."""
    page = (site / "results" / "demo" / "index.html").read_text()
    table = page[page.find("<table"):page.find("</table>")]
    headers = [h.strip() for h in re.findall(r"<th\b[^>]*>(.*?)</th>", table, flags=re.S)]
    first = re.search(r"<tbody>\s*<tr>(.*?)</tr>", table, flags=re.S)[1]
    labels = re.findall(r'<td data-label="([^"]*)"', first)
    assert headers[:2] == ["method", "Conf. ↑"] and labels == headers
