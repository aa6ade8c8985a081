"""mkdocs hook: every figure on a page is a link to its full-size file.

The results' multi-panel figures are 1,200 to 1,900 pixels wide and the content column is narrower, so
each ``<img>`` that is not already inside a link is wrapped in ``<a class="figure-link" href="...">`` to
the same file: a click opens it at full size. ``tests/test_site.py`` checks every image of the built site.
"""

from __future__ import annotations

import re

_IMG = re.compile(r"<img\b[^>]*>")
_SRC = re.compile(r"""\bsrc=(["'])(.*?)\1""")


def link_figures(html: str) -> str:
    """``html`` with each ``<img>`` outside an ``<a>`` wrapped in a link to its own ``src``."""
    out, last, depth = [], 0, 0
    for match in re.finditer(r"<a\b[^>]*>|</a>|<img\b[^>]*>", html):
        tag = match.group(0)
        if tag.startswith("<a"):
            depth += 1
        elif tag == "</a>":
            depth = max(depth - 1, 0)
        elif depth == 0 and (src := _SRC.search(tag)):
            out.append(html[last:match.start()])
            out.append(f'<a class="figure-link" href="{src.group(2)}" title="Open the figure at full size">{tag}</a>')
            last = match.end()
    out.append(html[last:])
    return "".join(out)


def on_page_content(html, **kwargs):
    return link_figures(html)
