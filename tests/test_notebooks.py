"""The notebooks in ``notebooks/``: jupytext percent-format files that run top to bottom in quick mode.

The default suite checks their format; the slow tier executes each one (``LINOPS_NOTEBOOK_QUICK=1``, figures in
a temporary folder) and checks that it wrote every figure it names. Their own ``assert``s check the papers' claims.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._env import user_env

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
FIGURE = re.compile(r'"(\w+\.png)"')


def test_there_is_a_notebook_per_paper():
    assert {p.stem for p in NOTEBOOKS} >= {"laplace", "projected", "subnetwork", "fsp"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_format(path):
    jupytext = pytest.importorskip("jupytext")
    text = path.read_text()
    notebook = jupytext.reads(text, fmt="py:percent")
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and kinds.count("markdown") >= 3 and kinds.count("code") >= 3, kinds
    assert notebook.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    assert 'os.environ.get("LINOPS_NOTEBOOK_QUICK") == "1"' in text, "the notebook must have a quick mode for CI"
    assert "LINOPS_NOTEBOOK_FIGURES" in text
    figures = FIGURE.findall(text)
    assert figures and all(f.startswith(path.stem + "_") for f in figures), figures
    assert re.search(r"^assert ", text, re.M), "a notebook checks the claims it shows"
    assert "posteriors.experiments" not in text, "notebooks use the public API only"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_quick_mode(path, tmp_path):
    env = user_env(LINOPS_NOTEBOOK_QUICK="1", LINOPS_NOTEBOOK_FIGURES=str(tmp_path), MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    missing = [f for f in FIGURE.findall(path.read_text()) if not (tmp_path / f).is_file()]
    assert not missing, f"{path.name} did not write {missing}"
