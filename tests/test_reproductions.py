"""The papers' protocols at ``--quick`` size: ``python -m posteriors projected|subnetwork|fsp --quick``.

Each run takes minutes on 2 CPU cores (the tier over 30 minutes), so they form their own tier
(``pytest -m reproduction -n 0``), run by hand before ``docs/results/`` changes, not in CI. They check
that the protocol ran as documented (the tables' rows, the convergence record next to alpha*, the
float32/float64 study) and the claims that reproduce at this size, with the margins measured in the runs
recorded in ``docs/results/``; the claims that do not reproduce are stated there with their measured
reasons, not asserted here.
"""

import json
import subprocess
import sys

import pytest

from tests._env import user_env

pytestmark = pytest.mark.reproduction


def _run(tmp_path, *argv):
    """The command as a user runs it: a fresh process, JAX's defaults (float32; this test session turns on
    float64, which changes what the experiments compute)."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "posteriors", *argv, "--quick", "--quiet", "--out", str(out),
                           "--compilation-cache", "none"], env=user_env(), capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_projected_on_the_papers_protocol(tmp_path):
    out = _run(tmp_path, "projected")
    table = json.loads((out / "projected.json").read_text())
    rows, meta = table["rows"], table["meta"]
    paper = " (paper's α = ‖θ‖²/r)"  # the same draws at the paper's equation 9 precision, 1 / alpha*
    assert list(rows) == ["MAP", "Projected", "Projected" + paper, "Loss-projected", "Loss-projected" + paper, "SWAG",
                          "SWAG (paper's settings)", "Last-layer Laplace", "Last-layer Laplace (paper's grid)",
                          "Diagonal Laplace", "Diagonal Laplace (paper's grid)", "Deep ensemble"]
    for label in ("Projected", "Loss-projected"):
        assert abs(rows[label + paper]["prior_precision"] * rows[label]["prior_precision"] - 1.0) < 1e-4
    assert meta["num_params"] == 61706  # the classic LeNet-5
    config, info = meta["config"], meta["posteriors"]
    # the baselines tuned widely (the subnetwork paper's appendix D.3), the projected paper's grid among the points
    assert config["paper_grid"] == [0.1, 1.0, 5.0, 10.0, 50.0, 100.0] and config["num_samples"] == 30
    assert min(config["prior_grid"]) == 1e-4 and max(config["prior_grid"]) == 1e4 and config["refine_prior"]
    for label in ("Last-layer Laplace", "Diagonal Laplace"):  # grid-searched, network predictive
        nll = {float(a): v for a, v in info[label]["grid"]["nll"].items()}
        assert info[label]["predictive"] == "network"
        assert rows[label]["prior_precision"] == pytest.approx(min(nll, key=nll.get), rel=1e-6)
        assert not info[label]["grid"]["at_edge"], (label, nll)  # the search bracketed its best
    swag = info["SWAG"]["grid"]
    assert len(swag["nll"]) == 12 and swag["nll"][f"lr={swag['learning_rate']:g},wd={swag['weight_decay']:g}"] == min(
        swag["nll"].values())
    for label in ("Projected", "Loss-projected"):  # the convergence of alpha*'s projections, reported
        for key in ("prior_precision", "trace_pi", "projection_sweeps", "projection_residual",
                    "trace_probes_converged"):
            assert key in info[label], (label, key)
    # table 3's claim that reproduces at every size measured: the projected posterior separates noise and
    # rotated digits from the test digits better than the MAP's max-softmax score
    for ood in ("noise", "rotated 90°"):
        assert rows["Projected"][f"auroc_{ood}"] > rows["MAP"][f"auroc_{ood}"] + 0.05, ood
    # table 2 (lemma 3.1): the projected posterior is the MAP in distribution, because its samples stay in the
    # kernel of the training Jacobian. Measured at this size: confidence 0.947 against 0.951, the same accuracy,
    # kernel residual 1.4e-2 after 145 CG steps, the training digits' OOD score 19 times below the test digits'
    # (before the Gram cut-off was corrected: 0.919, residual 7.4e-2, 1.8 times)
    projected, map_ = rows["Projected"], rows["MAP"]
    assert abs(projected["confidence"] - map_["confidence"]) < 0.01
    assert abs(projected["accuracy"] - map_["accuracy"]) < 0.01
    record = info["Projected"]
    assert record["trace_probes_converged"] and record["projection_residual"] < 0.05
    assert record["score_train_median"] < 0.2 * record["score_test_median"]


def test_subnetwork_on_the_papers_protocol(tmp_path):
    out = _run(tmp_path, "subnetwork")
    summary = json.loads((out / "subnetwork_summary.json").read_text())
    toy = summary["toy_regression"]
    methods = toy["methods"]
    # the measured reason the Wasserstein rule fails here: SGD leaves many weights without any data gradient,
    # they sit at the prior variance and are chosen first, and a 1% subnetwork of them changes nothing
    assert toy["weights_without_data_gradient"] > 0.25 * toy["num_weights"]
    assert methods["Wass 1%"]["mean_std_in_gap"] < 0.1 * methods["Full cov"]["mean_std_in_gap"]
    # excluding them keeps the in-between uncertainty at 3% (35 times wider in the gap than on the data in the
    # full run). At 1%, 26 weights, the ratio moves too much between runs to assert (74 in the full run, 1.9 in
    # one --quick run in float64)
    m = methods["Wass, data-constrained 3%"]
    assert m["mean_std_in_gap"] > 2 * m["mean_std_on_data"]
    mnist = summary["rotated_mnist"]
    assert mnist["share_without_data_gradient"]["diag-Laplace rule"] >= mnist["share_without_data_gradient"][
        "SWAG rule"]
    # figure 5 over 3 seeds: the log-likelihood under rotation (mean over the angles) rises with the subnetwork's
    # size at every step (the full run: -6.37, -5.16, -4.14, -3.73 for 100 to 2,000 weights), every size above the
    # MAP's, all with the one prior precision tuned at 2,000 weights
    sweep = summary["size_sweep"]
    assert sweep["seeds"] == 3 and len(sweep["prior_precision"]) == 3 and sweep["reference_size"] == 2000
    means = [sweep["rows"][f"Subnetwork ({s})"]["mean_over_angles"] for s in sweep["sizes"]]
    assert sweep["sizes"] == [100, 300, 1000, 2000]
    assert all(a < b for a, b in zip(means[:-1], means[1:], strict=True)), means
    assert means[0] > sweep["rows"]["MAP"]["mean_over_angles"]


def _check_rotated_seeds(out):
    """The claims of figure 4 that hold on every one of 3 seeds at ``--quick`` size (the recorded run:
    ``docs/results/subnetwork_rotated_quick_seeds.json``): the SWAG-rule subnetwork above the MAP (by 0.96 to 2.61
    over the angles) with the MAP's error, and the diagonal-Laplace rule's subnetwork, all weights without data
    gradient, the MAP itself."""
    record = json.loads((out / "subnetwork_rotated_seeds.json").read_text())
    assert record["seeds"] == 3 and record["meta"]["config"]["seed"] == [0, 1, 2]
    subnet, rule = "Subnet, SWAG rule (2000)", "Subnet, diag-Laplace rule (2000)"
    for k, rows in enumerate(record["per_seed"]):
        summary = json.loads((out / f"seed{k}" / "subnetwork_summary.json").read_text())["rotated_mnist"]
        assert summary["share_without_data_gradient"]["SWAG rule"] == 0.0
        assert summary["share_without_data_gradient"]["diag-Laplace rule"] > 0.9
        assert rows[subnet]["ll_mean"] > rows["MAP"]["ll_mean"] + 0.5, (k, rows)
        assert abs(rows[subnet]["error_0"] - rows["MAP"]["error_0"]) <= 0.01
        assert rows[rule]["ll_mean"] == pytest.approx(rows["MAP"]["ll_mean"], abs=1e-3)


def test_subnetwork_rotated_over_three_seeds(tmp_path):
    """``subnetwork --parts rotated --quick --seeds 3`` (18 minutes on 2 cores)."""
    _check_rotated_seeds(_run(tmp_path, "subnetwork", "--parts", "rotated", "--seeds", "3"))


def test_fsp_on_the_papers_mauna_loa_protocol(tmp_path):
    out = _run(tmp_path, "fsp", "--parts", "maunaloa")
    table = json.loads((out / "fsp_maunaloa.json").read_text())
    rows, info = table["rows"], table["meta"]["fsp_info"]
    fsp, fsp64 = rows["FSP-Laplace (RW kernel)"], rows["FSP-Laplace (RW kernel), float64"]
    # table 1's claim: the GP prior makes the network extrapolate better than plain Laplace, in MSE and in
    # log-likelihood (Mauna Loa's --quick is its whole protocol: a quicker one flips the MSE ranking)
    laplace = rows["Laplace (full, isotropic prior)"]
    assert fsp["test_mse"] < laplace["test_mse"]
    assert fsp["test_log_likelihood"] > laplace["test_log_likelihood"]
    # the cut-offs keep the directions the data need in both dtypes: float32 keeps at least 80% of float64's
    # and its predictive standard deviation is within 15% (a relative 1e-6 cut-off on A halved it)
    assert info["float32"]["rank"] >= 0.8 * info["float64"]["rank"]
    assert abs(fsp["test_std_mean"] - fsp64["test_std_mean"]) < 0.15 * fsp64["test_std_mean"]


def test_fsp_on_the_papers_tabular_regression_protocol(tmp_path):
    """Table C.1 at ``--quick`` size (2 of the 5 folds, 1,000 steps; the early stopping ends every run before).
    The orderings on Boston housing that also hold over all 5 folds (``docs/results/``): FSP-Laplace's expected
    log-likelihood is above the exact GP's (the paper: -0.641 against -1.136) and above evidence-tuned Laplace's.
    Above the MAP's and validation-tuned Laplace's it is at this size only, not over 5 folds (the page's verdict:
    not reproduced), so that is not asserted."""
    out = _run(tmp_path, "fsp", "--parts", "uci")
    table = json.loads((out / "fsp_uci.json").read_text())
    rows, folds = table["rows"], table["meta"]["folds"]
    methods = ("MAP", "Laplace", "Laplace, validation", "FSP-Laplace", "GP")
    assert set(rows) == {f"{d}: {m}" for d in ("boston", "diabetes") for m in methods}
    for name, n in (("boston", 506), ("diabetes", 442)):
        assert len(folds[name]) == 2
        for fold in folds[name]:
            assert fold["n_fit"] + fold["n_val"] + fold["n_test"] == n
            assert abs(fold["n_val"] - 0.1 * (fold["n_fit"] + fold["n_val"])) <= 1  # 10% of the training fold
    ell = {m: rows[f"boston: {m}"]["ell_mean"] for m in methods}
    assert ell["FSP-Laplace"] > ell["GP"] and ell["FSP-Laplace"] > ell["Laplace"], ell
    assert rows["boston: FSP-Laplace"]["paper"] == "-0.641 ± 0.084"


def test_fsp_on_the_offline_mnist_digits(tmp_path):
    """Table 2's analogue at ``--quick`` size: LeNet-5 on 900 digits, 3 seeds, FSP-Laplace with the paper's RND
    context (uniform images over each pixel's range), KFAC Laplace and the MAP. What holds at this size and in the
    recorded run (``docs/results/fsp.md``): with the paper's score, the predictive entropy, FSP-Laplace separates
    the photo patches and the uniform noise from the test digits better than the MAP and Laplace (AUROC 0.996 or
    more against 0.93-0.96 and below). Its in-distribution accuracy and log-likelihood, below the MAP's here (the
    page's verdicts: not reproduced), are not asserted."""
    out = _run(tmp_path, "fsp", "--parts", "mnist")
    table = json.loads((out / "fsp_mnist.json").read_text())
    assert table["seeds"] == 3 and table["config"]["fsp_context_kind"] == "uniform"
    assert table["config"]["architecture"] == "lenet5" and table["config"]["num_samples"] == 10
    rows = table["mean_se"]
    assert list(rows) == ["MAP", "KFAC Laplace", "FSP-Laplace"]
    for ood in ("photo patches", "noise"):
        key = f"auroc_entropy_{ood}"
        assert rows["FSP-Laplace"][key][0] > max(rows["MAP"][key][0], rows["KFAC Laplace"][key][0]), (ood, rows)
