"""``python -m posteriors``: every command runs on tiny data and writes its files; the paper's claims hold.

The runs are in the slow tier (each trains networks and fits every posterior: about a minute);
argument errors are checked in the default suite.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from posteriors.experiments.cli import build_parser, main

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")


def test_help_loads_no_jax_and_names_each_commands_methods_and_default():
    """``--help`` imports only the command line (the package's names load on first use), and each command's
    help lists the methods it knows with its own default."""
    code = ("import sys, contextlib, io\n"
            "from posteriors.experiments.cli import main\n"
            "for cmd in ([], ['projected'], ['inbetween'], ['demo']):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try: main([*cmd, '--help'])\n"
            "        except SystemExit: pass\n"
            "    print(' '.join(out.getvalue().split()))\n"
            "print('jax loaded:', 'jax' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    top, projected, inbetween, demo, loaded = done.stdout.strip().splitlines()
    assert loaded == "jax loaded: False"
    known = "from: map, full, diag, last_layer, kfac, lowrank, subnetwork, projected, loss_projected, fsp"
    assert known + ", swag, ensemble" in projected and known + ", swag, ensemble" in demo
    assert known + " (default: all)" in inbetween  # no SWAG or ensemble there
    assert "(default: map, projected, loss_projected, swag, last_layer, diag, ensemble)" in projected
    assert "--architecture {lenet5,resnet,mlp}" in projected and "--max-train N" in projected
    assert "(default: all)" in inbetween and "for demo" not in projected
    assert "(default: map, diag, last_layer, kfac, lowrank, subnetwork, projected, loss_projected, fsp)" in demo
    from posteriors.experiments import _common, methods

    assert _common.check_methods(("full",)) == ("full",) and "full" not in methods.DEFAULT_METHODS


def test_bad_arguments_fail_before_any_work(tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit, match=r"unknown method\(s\) \['laplace'\]; choose from map, full"):
        main(["demo", "--methods", "map,laplace", "--out", str(out)])
    with pytest.raises(SystemExit, match=r"unknown part\(s\) \['mauna'\]"):
        main(["fsp", "--parts", "mauna", "--out", str(out)])
    with pytest.raises(SystemExit):
        main(["projected", "--dataset", "cifar10", "--out", str(out)])
    assert "invalid choice: 'cifar10'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tables", "--out", str(out)])
    assert not out.exists()


def test_options_before_or_after_the_command():
    parser = build_parser()
    for argv in (["--quick", "--seed", "3", "inbetween"], ["inbetween", "--quick", "--seed", "3"]):
        args = parser.parse_args(argv)
        assert (args.command, args.quick, args.seed) == ("inbetween", True, 3)
    assert parser.parse_args([]).command is None


def test_help_lists_every_command():
    text = subprocess.run([sys.executable, "-m", "posteriors", "--help"], capture_output=True, text=True,
                          check=True).stdout
    for command in ("demo", "projected", "inbetween", "subnetwork", "fsp", "lora"):
        assert command in text


def _run(tmp_path, *argv):
    out = tmp_path / "out"
    assert main([*argv, "--smoke", "--quiet", "--out", str(out), "--compilation-cache", "none"]) == 0
    return out


@pytest.mark.slow
def test_demo_table_figures_and_the_projected_claims(tmp_path):
    out = _run(tmp_path, "demo")
    for name in ("demo.json", "demo.md", "demo_reliability.png", "demo_ood_scores.png", "demo_rotation.png",
                 "inbetween.png", "inbetween.json"):
        assert (out / name).stat().st_size > 0, name
    table = json.loads((out / "demo.json").read_text())
    rows = table["rows"]
    assert list(rows) == ["MAP", "Diagonal Laplace", "Last-layer Laplace", "KFAC Laplace", "Low-rank Laplace",
                          "Subnetwork Laplace", "Projected", "Loss-projected", "FSP-Laplace"]
    for method, row in rows.items():
        assert "error" not in row, (method, row)
        for col in ("confidence", "nll", "accuracy", "brier", "ece", "mce", "auroc_held-out classes",
                    "auroc_noise", "auroc_rotated 90°"):
            assert 0.0 <= row[col] <= (10.0 if col == "nll" else 1.0), (method, col, row[col])
    md = (out / "demo.md").read_text()
    for header in ("Conf.", "NLL", "Acc.", "Brier", "ECE", "MCE", "AUROC held-out"):
        assert header in md
    # lemma 3.1: the projected posterior predicts like the MAP on the data's distribution ...
    mp, pr = rows["MAP"], rows["Projected"]
    assert abs(pr["accuracy"] - mp["accuracy"]) <= 0.02
    assert abs(pr["nll"] - mp["nll"]) <= 0.1 * mp["nll"] + 0.01
    # ... and detects the held-out classes at least as well (the paper's table 3)
    assert pr["auroc_held-out classes"] >= mp["auroc_held-out classes"] - 0.01


def test_baseline_tuning_wide_by_default_or_the_papers():
    """``projected`` tunes its baselines widely by default (prior precision 1e-4 to 1e4 with the paper's points
    among them, refined; SWAG's learning rate and weight decay on a grid), or as the projected paper did."""
    from posteriors.experiments.cli import PAPER_PRIOR_GRID, _classification_config
    from posteriors.experiments.methods import SWAG_GRID

    wide = _classification_config(build_parser().parse_args(["projected"]), "projected")
    assert wide.paper_grid == PAPER_PRIOR_GRID and min(wide.prior_grid) == 1e-4  # the paper's grid searched too
    assert max(wide.prior_grid) == 1e4 and wide.refine_prior and wide.swag_grid == SWAG_GRID
    assert (1e-2, 3e-4) in SWAG_GRID  # the paper's fixed SWAG among the candidates
    paper = _classification_config(build_parser().parse_args(["projected", "--baseline-tuning", "paper"]),
                                   "projected")
    assert paper.prior_grid == PAPER_PRIOR_GRID and not paper.refine_prior and paper.swag_grid is None
    assert (paper.swag_learning_rate, paper.swag_weight_decay) == (1e-2, 3e-4)
    # the ResNet's MAP decays Adam's rate (constant, it collapsed late in training); LeNet-5's keeps the paper's
    resnet = _classification_config(build_parser().parse_args(["projected", "--architecture", "resnet"]),
                                    "projected")
    assert resnet.cosine_decay and not wide.cosine_decay and resnet.learning_rate == wide.learning_rate == 1e-3


@pytest.mark.slow
def test_projected_command(tmp_path):
    out = _run(tmp_path, "projected", "--dataset", "digits", "--methods", "map,diag,swag,projected")
    table = json.loads((out / "projected.json").read_text())
    rows, info = table["rows"], table["meta"]["posteriors"]
    paper = "Projected (paper's α = ‖θ‖²/r)"  # the same draws at the paper's equation 9 precision, 1 / alpha*
    assert list(rows) == ["MAP", "Diagonal Laplace", "Diagonal Laplace (paper's grid)", "SWAG",
                          "SWAG (paper's settings)", "Projected", paper]
    # the baselines' tuning: every candidate's validation NLL recorded, the chosen one the smallest; the prior
    # precision's search brackets its best (or reached 1e8 / 1e-8) and refines it by quarter decades
    grid = info["Diagonal Laplace"]["grid"]
    nll = {float(a): v for a, v in grid["nll"].items()}
    best = min(nll, key=nll.get)
    assert rows["Diagonal Laplace"]["prior_precision"] == pytest.approx(best, rel=1e-6)
    assert {1e-4, 0.1, 1.0, 5.0, 10.0, 50.0, 100.0, 1e4} <= set(nll)
    config = table["meta"]["config"]
    decades = {a: v for a, v in nll.items() if a in config["prior_grid"] + config["paper_grid"] or
               float(np.log10(a)).is_integer()}  # the coarse grids and their extension by decades
    coarse = min(decades, key=decades.get)
    assert all(any(a == pytest.approx(coarse * 10**step) for a in nll) for step in (-0.75, -0.25, 0.25, 0.75))
    assert grid["at_edge"] == (best in (min(nll), max(nll))) and (not grid["at_edge"] or best >= 1e8 or best <= 1e-8)
    # the row as the paper tuned it: the best of its grid 0.1 to 100 alone
    on_papers = {a: nll[a] for a in (0.1, 1.0, 5.0, 10.0, 50.0, 100.0)}
    assert grid["paper_choice"] == min(on_papers, key=on_papers.get)
    assert rows["Diagonal Laplace (paper's grid)"]["prior_precision"] == pytest.approx(grid["paper_choice"])
    swag = info["SWAG"]["grid"]
    assert len(swag["nll"]) == 12 and "paper_posterior" not in swag
    chosen = f"lr={swag['learning_rate']:g},wd={swag['weight_decay']:g}"
    assert swag["nll"][chosen] == min(swag["nll"].values())
    assert abs(rows[paper]["prior_precision"] * rows["Projected"]["prior_precision"] - 1.0) < 1e-4
    assert rows[paper]["accuracy"] == pytest.approx(rows["Projected"]["accuracy"], abs=0.05)
    assert (out / "projected_rotation.png").stat().st_size > 0


def test_the_seeds_table_is_each_entrys_mean_and_standard_error(tmp_path):
    """`write_seed_table`: every entry is the mean over the seeds and its standard error (sample standard deviation
    over the square root of the number of seeds); a row or value a seed lacks is left out, not averaged over fewer
    seeds."""
    from posteriors.experiments._common import write_seed_table

    per_seed = [{"A": {"x": 1.0, "y": 2.0}, "B": {"x": 0.0}, "C": {"x": 5.0}},
                {"A": {"x": 3.0, "y": None}, "B": {"x": 4.0}},
                {"A": {"x": 8.0, "y": 1.0}, "B": {"x": 2.0}}]
    md = write_seed_table(tmp_path, "t", "title", [("x", "X"), ("y", "Y")], per_seed, ["a note"], {"k": 1})
    record = json.loads((tmp_path / "t.json").read_text())
    table = record["mean_se"]
    assert list(table) == ["A", "B"] and record["seeds"] == 3 and record["per_seed"] == per_seed
    assert table["A"]["x"] == pytest.approx([4.0, np.std([1.0, 3.0, 8.0], ddof=1) / np.sqrt(3)])
    assert table["B"]["x"] == pytest.approx([2.0, 2.0 / np.sqrt(3)]) and "y" not in table["A"]
    assert "| A | 4.000 ± 2.082 | — |" in md and "Mean ± standard error over 3 seeds." in md
    assert (tmp_path / "t.md").read_text() == md


def test_subnetwork_seeds_run_the_rotated_part_per_seed_and_the_rest_once(tmp_path, monkeypatch, capsys):
    """``subnetwork --seeds 3``: the rotated part once per seed (``--seed`` to ``--seed + 2``), each into its own
    ``seed<k>/``; the toy regression and the size sweep once (they repeat their own seeds); the seeds table holds
    each method's mean ± standard error of the log-likelihood at every angle, over the angles, and the error at
    0°. ``subnetwork.run`` is replaced by a recorder (the real run is the slow tier's and the reproductions')."""
    from posteriors.experiments import subnetwork

    calls = []

    def fake_run(out, size, log, *, parts=subnetwork.PARTS, seed=0):
        calls.append((out.name, size, tuple(parts), seed))
        if "rotated" not in parts:
            return {"size": size}
        ll = {"MAP": [-0.1 * seed, -10.0 - seed], "Subnet": [-0.2, -5.0 + seed]}
        return {"rotated_mnist": {"num_params": 7, "subnetwork_size": 3, "angles": [0, 90], "results": {
            name: {"log_likelihood": v, "error": [0.1 * seed, 0.9], "ece": [0.0, 0.5]} for name, v in ll.items()}}}

    monkeypatch.setattr(subnetwork, "run", fake_run)
    out = tmp_path / "out"
    assert main(["subnetwork", "--quick", "--seeds", "3", "--seed", "4", "--parts", "regression,rotated", "--quiet",
                 "--out", str(out), "--compilation-cache", "none"]) == 0
    assert calls == [("out", "quick", ("regression",), 0), ("seed4", "quick", ("rotated",), 4),
                     ("seed5", "quick", ("rotated",), 5), ("seed6", "quick", ("rotated",), 6)]
    record = json.loads((out / "subnetwork_rotated_seeds.json").read_text())
    table, se = record["mean_se"], np.std([4.0, 5.0, 6.0], ddof=1) / np.sqrt(3)
    assert record["seeds"] == 3 and record["meta"]["config"] == {"size": "quick", "seed": [4, 5, 6]}
    assert table["MAP"]["ll_90"] == pytest.approx([-15.0, se])
    assert table["MAP"]["ll_0"] == pytest.approx([-0.5, 0.1 * se])
    assert table["Subnet"]["ll_mean"] == pytest.approx([-0.1, se / 2])  # the mean of -0.2 and -5 + seed
    assert table["MAP"]["error_0"] == pytest.approx([0.5, 0.1 * se])
    assert "| Subnet | -0.200 ± 0.000 | 0.000 ± 0.577 |" in capsys.readouterr().out


def test_the_grid_search_extends_past_an_edge_refines_and_skips_what_cannot_be_factored():
    """`grid_search` on a known NLL with its minimum at 3,000: the grid 0.1 to 100 has it at its edge, so the
    search goes a decade on (1,000, then 10,000 brackets it) and refines by quarter decades (3,162 wins); a value
    whose posterior cannot be factored counts as an infinite NLL; any other error is raised."""
    from posteriors.experiments._common import FINE_STEPS, grid_search

    def nll_of(a):
        if a < 0.05:
            raise ValueError("laplace: the posterior precision ... is not numerically positive definite in float32")
        return (np.log10(a) - np.log10(3000.0)) ** 2

    best, nlls, at_edge = grid_search(nll_of, (0.1, 1.0, 10.0, 100.0), refine=True, also=(0.01,))
    assert best == pytest.approx(10**3.5) and not at_edge and nlls[0.01] == float("inf")
    assert {1000.0, 10000.0} <= set(nlls) and len(nlls) == 7 + len(FINE_STEPS)
    assert list(nlls) == sorted(nlls)
    best, nlls, at_edge = grid_search(lambda a: -a, (1.0, 10.0), refine=True, limits=(1e-2, 1e3))
    assert best == pytest.approx(1e3 * 10**0.75) and at_edge  # stopped at the limit, then refined: still the edge
    with pytest.raises(ValueError, match="another error"):
        grid_search(lambda a: (_ for _ in ()).throw(ValueError("another error")), (1.0,))


def test_seeds_must_be_positive(tmp_path):
    with pytest.raises(SystemExit, match=r"python -m posteriors inbetween: --seeds must be at least 1, got 0"):
        main(["inbetween", "--seeds", "0", "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()
    for command, parts, seeded in (("subnetwork", "regression,sizes", "rotated"), ("fsp", "uci", "maunaloa")):
        with pytest.raises(SystemExit, match=rf"python -m posteriors {command}: --seeds repeats the {seeded} part, "
                                             rf"which --parts {parts} leaves out"):
            main([command, "--parts", parts, "--seeds", "2", "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_inbetween_command(tmp_path):
    out = _run(tmp_path, "inbetween", "--methods", "map,full,diag,projected", "--seeds", "2")
    seeds = json.loads((out / "inbetween_seeds.json").read_text())
    per_seed = [json.loads((out / f"seed{k}" / "inbetween.json").read_text())["rows"] for k in (0, 1)]
    assert seeds["per_seed"] == per_seed and per_seed[0] != per_seed[1]  # two different runs
    gap = [rows["Full Laplace"]["std_gap"] for rows in per_seed]
    assert seeds["mean_se"]["Full Laplace"]["std_gap"] == pytest.approx([np.mean(gap), abs(gap[0] - gap[1]) / 2])
    out = out / "seed0"
    rows = json.loads((out / "inbetween.json").read_text())["rows"]
    assert rows["MAP"]["std_gap"] == 0.0 and rows["Full Laplace"]["std_gap"] > 0.0
    assert rows["Projected"]["std_gap"] > rows["Projected"]["std_data"]  # wider in the gap than on the data
    assert (out / "inbetween.png").stat().st_size > 0


def test_unknown_parts_stop_before_any_work():
    for command, known in (("subnetwork", "regression, rotated, sizes"),
                           ("fsp", "regression, two_moons, maunaloa, uci, mnist")):
        with pytest.raises(SystemExit, match=rf"python -m posteriors {command}: unknown part\(s\) \['sine'\]; "
                                             rf"choose from {known}"):
            main([command, "--parts", "rotated,sine" if command == "subnetwork" else "sine"])


@pytest.mark.slow
def test_subnetwork_command(tmp_path):
    out = _run(tmp_path, "subnetwork")
    summary = json.loads((out / "subnetwork_summary.json").read_text())
    toy = summary["toy_regression"]
    assert toy["num_weights"] < toy["num_params"]  # inference over the weights, not the biases (appendix D.1)
    assert toy["methods"]["Full cov"]["error_vs_full"] == 0.0
    assert set(toy["beats_random"]) == {"Wass", "Wass, data-constrained", "Predictive effect"}
    assert summary["rotated_mnist"]["angles"][0] == 0
    assert {"SWAG", "Deep ensemble", "MAP"} <= set(summary["rotated_mnist"]["results"])
    sweep = summary["size_sweep"]  # figure 5: every size, one prior precision tuned at the reference size
    assert sweep["sizes"] == [20, 200] and sweep["reference_size"] == 200 and len(sweep["prior_precision"]) == 1
    for s in sweep["sizes"]:
        row = sweep["rows"][f"Subnetwork ({s})"]
        assert row["covariance_bytes"] == 4 * s * s and len(row["log_likelihood"]) == len(sweep["angles"])
        assert row["mean_over_angles"] == pytest.approx(sum(row["log_likelihood"]) / len(sweep["angles"]))
    for name in ("subnetwork_regression.png", "subnetwork_rotated_mnist.png", "subnetwork_sizes.png"):
        assert (out / name).stat().st_size > 0


@pytest.mark.slow
def test_fsp_command(tmp_path):
    out = _run(tmp_path, "fsp", "--parts", "maunaloa")
    rows = json.loads((out / "fsp_maunaloa.json").read_text())["rows"]
    assert set(rows) == {"FSP-Laplace (RW kernel)", "FSP-Laplace (RW kernel), float64",
                         "Laplace (full, isotropic prior)", "GP (RW kernel, exact; reference)"}
    for row in rows.values():
        assert row["test_mse"] > 0 and row["test_log_likelihood_per_month"] < 10
    assert (out / "fsp_maunaloa.png").stat().st_size > 0


def test_the_compilation_cache_is_opt_in_and_written_where_asked(tmp_path):
    """Importing the library sets no cache; `use_compilation_cache` (what the command line calls) writes compiled
    programs to its directory. In a subprocess: the setting is process-wide."""
    code = (
        "import sys, jax, jax.numpy as jnp, posteriors, linops\n"
        "assert not jax.config.jax_compilation_cache_dir, 'set at import'\n"
        "import posteriors as pst\n"
        "pst.use_compilation_cache(sys.argv[1])\n"
        "def long(a):\n"
        "    for i in range(120):\n"
        "        a = jnp.sin(a) @ a.T + i\n"
        "    return a\n"
        "jax.jit(long)(jnp.ones((8, 8))).block_until_ready()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], check=True)
    assert any((tmp_path / "cache").iterdir())


def test_figures_carry_labels_counts_and_legends(tmp_path, monkeypatch):
    """The comparison's figures as a reader needs them: reliability bars labelled with how many test images
    each bin holds, and OOD scores as empirical CDFs on a log axis (scores orders of magnitude apart stay
    apart) with labelled axes and a legend, naming each set's size, in every panel."""
    import jax.numpy as jnp
    import matplotlib.pyplot as plt
    import numpy as np

    from posteriors.experiments import classification

    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    rng = np.random.default_rng(0)
    probs = jnp.asarray(rng.dirichlet(np.ones(3), 50))
    labels = jnp.asarray(rng.integers(0, 3, 50))
    reliability = {m: classification._reliability(probs, labels) for m in ("MAP", "Projected")}
    scores = {m: {"test": rng.uniform(0, 1e-6, 50), "noise": rng.uniform(1, 2, 30)} for m in reliability}
    classification._figures(tmp_path, "x", reliability, scores, shifts=None)
    assert {p.name for p in tmp_path.iterdir()} == {"x_reliability.png", "x_ood_scores.png"}
    rel, ood = closed
    counts = reliability["MAP"]["count"]
    for ax in rel.axes[:2]:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
        assert sorted(int(t.get_text()) for t in ax.texts) == sorted(n for n in counts if n)
    for ax in ood.axes[:2]:
        assert ax.get_xscale() == "log" and ax.get_xlabel() and ax.get_ylabel()
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["test (50)", "noise (30)"]


@pytest.mark.slow
def test_lora_command(tmp_path):
    out = _run(tmp_path, "lora")
    record = json.loads((out / "lora.json").read_text())
    assert set(record["rows"]) == {"MAP", "Laplace-LoRA (kfac)"}
    assert all(0.0 <= row["ece"] <= 1.0 and row["nll"] > 0 for row in record["rows"].values())
    assert "NLL per byte" in (out / "lora.md").read_text()
