"""mkdocs hook: the site's MathJax is served with the site, so that its math renders offline.

MathJax 3 comes from the ``sphinx-mathjax-offline`` package (in the ``docs`` extra), which ships its
files; after each build they are copied into ``<site>/javascripts/mathjax``, the address
``mkdocs.yml`` loads it from. Nothing is fetched from the network, at build time or when the
pages are read.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

# The combined component with every TeX extension and SVG output (its glyphs are paths: no web fonts), and what
# it loads on demand: the menu and the accessibility extensions.
PARTS = ("tex-svg-full.js", "ui", "a11y", "input")


def mathjax_source() -> Path:
    """The directory of the packaged MathJax files."""
    try:
        dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("docs: MathJax is served with the site from the sphinx-mathjax-offline package, which "
                           "is not installed; install the docs extra: pip install -e '.[docs]'") from None
    return Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))


def on_post_build(config, **kwargs):
    source = mathjax_source()
    target = Path(config["site_dir"]) / "javascripts" / "mathjax"
    target.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, target / part, dirs_exist_ok=True)
        else:
            shutil.copy2(source / part, target / part)
