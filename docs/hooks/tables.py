"""mkdocs hook: every table cell knows its column, so that a phone can show a table one row at a time.

A results table has up to twelve columns and cannot fit a phone's 390 pixels side by side. Each body cell gets
``data-label`` (its column's header text, tags stripped); ``docs/stylesheets/extra.css`` turns every row of a
table into a card on a narrow screen, each cell on its own line after its label. ``tests/test_site.py`` checks
that no table is wider than the content at 390 and at 1,280 pixels.
"""

from __future__ import annotations

import html as _html
import re

_TABLE = re.compile(r"<table\b[^>]*>.*?</table>", re.S)
_HEADER = re.compile(r"<th\b[^>]*>(.*?)</th>", re.S)
_BODY = re.compile(r"<tbody\b[^>]*>.*?</tbody>", re.S)
_ROW = re.compile(r"<tr\b[^>]*>.*?</tr>", re.S)
_CELL = re.compile(r"<td\b")


def _text(fragment: str) -> str:
    return " ".join(_html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def _label_row(row: str, labels: list[str]) -> str:
    count = iter(range(len(labels) + 10**6))

    def label(_match):
        i = next(count)
        return f'<td data-label="{_html.escape(labels[i], quote=True)}"' if i < len(labels) else "<td"

    return _CELL.sub(label, row)


def label_cells(html: str) -> str:
    """``html`` with each ``<td>`` of a table's body given ``data-label``: the text of its column's header."""

    def table(match):
        t = match.group(0)
        head = t[:t.find("<tbody")] if "<tbody" in t else t
        labels = [_text(h) for h in _HEADER.findall(head)]
        if not labels:
            return t
        return _BODY.sub(lambda b: _ROW.sub(lambda r: _label_row(r.group(0), labels), b.group(0)), t)

    return _TABLE.sub(table, html)


def on_page_content(html, **kwargs):
    return label_cells(html)
