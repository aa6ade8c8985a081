"""The command line: ``python -m posteriors [demo|projected|inbetween|subnetwork|fsp] [options]``.

``demo`` (the default) trains a small tanh MLP on scikit-learn's digits 0-4, fits every posterior
around it (MAP, diagonal, last-layer, KFAC, low-rank, subnetwork, projected, loss-projected and
FSP-Laplace), prints the comparison table (confidence, NLL, accuracy, Brier, ECE, MCE and OOD
AUROC against the held-out digits 5-9, noise images and rotated digits), and writes it as JSON
and Markdown with figures (reliability diagrams, OOD score histograms, a rotation shift, and the
in-between uncertainty of a 1-D toy) into ``--out``. The other commands reproduce one paper's
comparison each. ``--quick`` finishes in a few minutes on 2 CPU cores.

Examples:
    >>> from posteriors.experiments.cli import build_parser
    >>> args = build_parser().parse_args(["demo", "--quick", "--methods", "map,projected"])
    >>> args.command, args.quick, args.methods
    ('demo', True, 'map,projected')
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from posteriors.compilation import DEFAULT_CACHE, use_compilation_cache
from posteriors.experiments.methods import (
    CLASSIFICATION_METHODS,
    DEFAULT_METHODS,
    METHODS,
    PROJECTED_METHODS,
    SWAG_GRID,
    WIDE_PRIOR_GRID,
)

COMMANDS = {
    "demo": "every posterior on digits 0-4: the comparison table, figures, and the in-between toy",
    "projected": "the projected-Bayes paper's tables 2-3 and figure 6 on its protocol: LeNet-5 on MNIST digits",
    "inbetween": "in-between uncertainty on a 1-D toy regression (projected-Bayes figure 4)",
    "subnetwork": "subnetwork inference: toy regression, rotated digits, the size sweep (figures 2, 4 and 5)",
    "fsp": "FSP-Laplace: toy regression, two moons, Mauna Loa CO2, UCI-style regression, MNIST digits (figure 1, "
           "C.5-C.6, tables 1, 2 and C.1)",
    "lora": "Laplace-LoRA on a byte-level transformer (12.9M parameters, the standard library's text): against the "
            "fine-tuned MAP on held-out prose and byte code",
}
"""The commands of ``python -m posteriors``, with a line on what each reproduces."""

PARTS = {"subnetwork": ("regression", "rotated", "sizes"),
         "fsp": ("regression", "two_moons", "maunaloa", "uci", "mnist")}
"""The parts of the commands that have several (``--parts``), in their default order."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m posteriors``.

    Examples:
        >>> from posteriors.experiments.cli import build_parser
        >>> build_parser().parse_args([]).command is None      # no command: the demo
        True
    """
    parser = argparse.ArgumentParser(
        prog="python -m posteriors",
        description="Reproduce the papers' comparisons of Laplace-family posteriors on offline data.",
        epilog="Without a command, runs `demo`. Results go to --out (default: posteriors-results/<command>).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common_options(p, default=argparse.SUPPRESS)  # given after the command, or before it
        if name in ("demo", "projected"):
            p.add_argument("--dataset", choices=["digits", "mnist"], default=argparse.SUPPRESS,
                           help=f"the offline image data (default: {'digits' if name == 'demo' else 'mnist'})")
        if name == "projected":
            p.add_argument("--architecture", choices=["lenet5", "resnet", "mlp"], default="lenet5",
                           help="the network (default: %(default)s, the paper's for MNIST; resnet: the paper's "
                                "for CIFAR-10 and SVHN, here on the same digits)")
            p.add_argument("--max-train", type=int, default=None, metavar="N",
                           help="train on at most N images, validation included (default: all 4,000 of the "
                                "training split; --quick: 500). The projections' cost grows with N")
            p.add_argument("--in-classes", default="0,1,2,3,4,5,6,7,8,9",
                           help="comma-separated classes to train on (default: all ten, as the paper; the rest "
                                "become an OOD set of held-out classes)")
            p.add_argument("--baseline-tuning", choices=["wide", "paper"], default="wide",
                           help="wide (default): the baselines' prior precision by validation NLL over 1e-4 to 1e4 "
                                "and quarter decades around the best, SWAG's learning rate and weight decay by "
                                "validation NLL (the subnetwork paper's appendix D.3); paper: the projected paper's "
                                "grid 0.1 to 100 and its fixed SWAG settings (appendix C.3)")
        if name in ("projected", "inbetween", "fsp", "subnetwork"):
            p.add_argument("--seeds", type=int, default=1, metavar="N",
                           help="run the seeds --seed to --seed + N - 1, each into <out>/seed<k>/, and write the "
                                "mean ± standard error over them as <name>_seeds.{json,md} (fsp: its Mauna Loa "
                                "part; subnetwork: its rotated part, as subnetwork_rotated_seeds; default: 1)")
        if name in ("demo", "projected", "inbetween"):
            known = METHODS if name == "inbetween" else CLASSIFICATION_METHODS
            chosen = {"demo": DEFAULT_METHODS, "projected": PROJECTED_METHODS, "inbetween": METHODS}[name]
            p.add_argument("--methods", help=f"comma-separated methods, from: {', '.join(known)} (default: "
                                             f"{'all' if chosen == known else ', '.join(chosen)})")
        if name in PARTS:
            p.add_argument("--parts", default=",".join(PARTS[name]),
                           help="comma-separated parts (default: %(default)s)")
    _common_options(parser)
    parser.add_argument("--dataset", choices=["digits", "mnist"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--methods", help=argparse.SUPPRESS)
    parser.set_defaults(architecture="lenet5", in_classes="0,1,2,3,4,5,6,7,8,9", max_train=None,
                        baseline_tuning="wide", seeds=1)
    return parser


def _common_options(p, default=None):
    def d(value):
        return value if default is None else default

    p.add_argument("--out", type=Path, default=d(None), help="output directory (default: posteriors-results/<command>)")
    p.add_argument("--quick", action="store_true", default=d(False),
                   help="smaller settings: a few minutes on 2 CPU cores")
    p.add_argument("--seed", type=int, default=d(0), help="the seed of every random choice (default: 0)")
    p.add_argument("--quiet", action="store_true", default=d(False), help="no progress output on stderr")
    p.add_argument("--smoke", action="store_true", default=d(False), help=argparse.SUPPRESS)  # tiny, for tests
    p.add_argument("--compilation-cache", type=Path, default=d(DEFAULT_CACHE), metavar="DIR",
                   help=f"JAX's persistent compilation cache: programs compiled by one run are read back by the "
                        f"next (default: {DEFAULT_CACHE}; 'none' to switch it off)")


def _methods(text, known, who):
    if text is None:
        return None
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        raise SystemExit(f"python -m posteriors {who}: unknown method(s) {unknown or [text]}; "
                         f"choose from {', '.join(known)}")
    return methods


PAPER_PRIOR_GRID = (0.1, 1.0, 5.0, 10.0, 50.0, 100.0)
"""The projected-Bayes paper's grid for the baselines' prior precision (appendix C.3)."""

def _classes(text, who):
    try:
        classes = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        classes = ()
    if len(classes) < 2 or len(set(classes)) != len(classes) or not all(0 <= c <= 9 for c in classes):
        raise SystemExit(f"python -m posteriors {who}: --in-classes must be two or more distinct digits 0-9 "
                         f"separated by commas, got {text!r}")
    return classes


def _classification_config(args, command):
    from posteriors.experiments.classification import Config

    methods = _methods(args.methods, CLASSIFICATION_METHODS, command)
    if methods is None:
        methods = DEFAULT_METHODS if command == "demo" else PROJECTED_METHODS
    dataset = args.dataset or ("digits" if command == "demo" else "mnist")
    cfg = Config(dataset=dataset, methods=methods, seed=args.seed)
    if command == "projected":
        # the paper's appendix C.3: LeNet, Adam 1e-3, prior grid on validation, network predictive for the
        # last-layer and diagonal baselines (and SWAG), 30 samples, projections of batch 16 and 1,000 sweeps
        architecture = args.architecture if dataset == "mnist" else "mlp"
        cfg = dataclasses.replace(cfg, architecture=architecture, in_classes=_classes(args.in_classes, command),
                                  learning_rate=1e-3, steps=3000, num_samples=30, prior_grid=PAPER_PRIOR_GRID,
                                  validation_fraction=0.1, network_predictive=("diag", "last_layer", "swag"),
                                  projection_batch=16, projection_sweeps=1000, paper_convention=True,
                                  # the ResNet's constant 1e-3 collapsed to chance late in training (loss 189 at
                                  # step 800, 1,229 at step 900; docs/results/projected.md): decayed to 0 for it
                                  cosine_decay=architecture == "resnet")
        if args.baseline_tuning == "wide":
            cfg = dataclasses.replace(cfg, prior_grid=WIDE_PRIOR_GRID, refine_prior=True, swag_grid=SWAG_GRID,
                                      paper_grid=PAPER_PRIOR_GRID)  # and a row per baseline as the paper tuned it
    elif dataset == "mnist":
        cfg = dataclasses.replace(cfg, width=64, batch_size=128, steps=4000, fsp_context=200)
    if args.quick:
        mnist = dataset == "mnist"
        cfg = dataclasses.replace(cfg, steps=1000, num_samples=30, fsp_steps=600, marglik_steps=50,
                                  angles=(0, 45, 90, 180), ensemble_members=3,
                                  projection_sweeps=1000 if command == "projected" else 200,  # CG stops earlier
                                  max_train=(500 if command == "projected" else 1000) if mnist else None,
                                  max_test=500 if mnist else None)
    if command == "projected" and args.max_train is not None:
        if args.max_train < 20:
            raise SystemExit(f"python -m posteriors projected: --max-train must be at least 20, got {args.max_train}")
        cfg = dataclasses.replace(cfg, max_train=args.max_train)
    if args.smoke:
        cfg = dataclasses.replace(cfg, max_train=150, max_test=100, width=16, steps=200, num_samples=10,
                                  projection_sweeps=30, fsp_steps=50, fsp_context=20, marglik_steps=10, lowrank=5,
                                  subnetwork_swag_steps=100,
                                  angles=(0, 90), swag_snapshots=4, ensemble_members=2)
    return cfg


def _inbetween_config(args):
    from posteriors.experiments.inbetween import Config

    cfg = Config(seed=args.seed, methods=_methods(args.methods, METHODS, "inbetween") or METHODS)
    if args.quick:
        cfg = dataclasses.replace(cfg, steps=2000, fsp_steps=1000)
    if args.smoke:
        cfg = dataclasses.replace(cfg, n=30, width=16, steps=200, fsp_steps=50, subnetwork_swag_steps=100)
    return cfg


def _parts(command, text):
    known = PARTS[command]
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in known]
    if bad or not parts:
        raise SystemExit(f"python -m posteriors {command}: unknown part(s) {bad or [text]}; choose from "
                         f"{', '.join(known)}")
    return parts


def main(argv=None) -> int:
    """Run ``python -m posteriors`` with ``argv`` (default: the process's arguments); returns the exit code.

    Bad arguments (an unknown command, method, dataset or part) stop it before any work.

    Examples:
        >>> from posteriors.experiments.cli import main
        >>> main(["subnetwork", "--parts", "sine"])
        Traceback (most recent call last):
        ...
        SystemExit: python -m posteriors subnetwork: unknown part(s) ['sine']; choose from regression, rotated, sizes
    """
    args = build_parser().parse_args(argv)
    command = args.command or "demo"
    if args.seeds < 1:
        raise SystemExit(f"python -m posteriors {command}: --seeds must be at least 1, got {args.seeds}")
    if command in ("demo", "projected"):
        args.config = _classification_config(args, command)
    elif command == "inbetween":
        args.config = _inbetween_config(args)
    elif command in PARTS:
        args.config = _parts(command, args.parts)
        seeded = {"subnetwork": "rotated", "fsp": "maunaloa"}[command]
        if args.seeds > 1 and seeded not in args.config:
            raise SystemExit(f"python -m posteriors {command}: --seeds repeats the {seeded} part, which --parts "
                             f"{args.parts} leaves out")
    out = args.out or Path("posteriors-results") / command
    use_compilation_cache(args.compilation_cache)
    try:
        return _run(command, args, out)
    except ImportError as err:
        print(f"python -m posteriors {command}: {err}\nInstall the experiments' dependencies with: "
              'pip install -e ".[examples]"', file=sys.stderr)
        return 2


def _run(command, args, out: Path) -> int:
    from posteriors.experiments._common import Log

    log = Log(quiet=args.quiet)
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or args.smoke
    if args.seeds > 1 and command in ("projected", "inbetween"):
        print(_seeds(command, args, out, log))
    elif command in ("demo", "projected"):
        from posteriors.experiments import classification

        result = classification.run(args.config, out, log, name=command if command == "projected" else "demo")
        print(result["markdown"])
        if command == "demo":
            from posteriors.experiments import inbetween

            icfg = _inbetween_config(args)
            icfg = dataclasses.replace(icfg, methods=("map", "full", "diag", "kfac", "last_layer", "projected"))
            print(inbetween.run(icfg, out, log, name="inbetween")["markdown"])
    elif command == "inbetween":
        from posteriors.experiments import inbetween

        print(inbetween.run(args.config, out, log)["markdown"])
    elif command == "subnetwork":
        from posteriors.experiments import subnetwork

        size = "smoke" if args.smoke else "quick" if args.quick else "full"
        if args.seeds > 1:  # main() has checked that the parts include "rotated"
            once = tuple(part for part in args.config if part != "rotated")
            if once:  # the toy regression and the size sweep repeat their own seeds: once
                print(_subnetwork_text(subnetwork.run(out, size, log, parts=once)))
            print(_subnetwork_seeds(args, out, size, log))
        else:
            print(_subnetwork_text(subnetwork.run(out, size, log, parts=args.config, seed=args.seed)))
    elif command == "lora":
        print(_lora(args, out, log))
    elif command == "fsp":
        from posteriors.experiments import fsp

        summary = fsp.run(out, quick, log, parts=args.config, seed=args.seed, seeds=args.seeds)
        if "maunaloa" in summary:
            print(summary["maunaloa"]["markdown"])
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    print(f"\nwrote to {out}/: {', '.join(files)}")
    return 0


def _lora(args, out: Path, log) -> str:
    """The ``lora`` command: `posteriors.experiments.lora.run` at the real size (``--quick``: the small model, a
    minute; ``--smoke``: a few steps), its table written as ``lora.{json,md}``; returns its Markdown."""
    import jax

    from posteriors.experiments import lora
    from posteriors.experiments._common import write_table

    if args.smoke:
        options = dict(size="small", rank=2, pretrain_steps=4, finetune_steps=4, num_fit=4, num_test=2, length=8)
    elif args.quick:
        options = dict(size="small", pretrain_steps=200, finetune_steps=100, num_fit=64, num_test=16, length=16)
    else:
        options = dict(size="real", pretrain_steps=150, finetune_steps=100, predictive_samples=64)
    log(f"lora: {options}")
    r = lora.run(jax.random.key(args.seed), quiet=args.quiet, **options)
    t = r["times"]
    notes = [f"{r['num_params']:,} parameters, {r['num_adapter_params']:,} in rank-{r['settings']['rank']} adapters on "
             "the query and value projections; fine-tuned on the prose of pydoc_data, tested on its held-out end and "
             "on marshalled byte code (OOD AUROC of the mean predictive entropy per sequence)",
             f"KFAC Laplace on the adapters with the Monte-Carlo Fisher, prior precision {r['prior_precision']:.3g} "
             f"(the evidence's); fit {t['fit_s']:.1f} s, predictive {t['predictive_s']:.1f} s",
             "one seed: differences within a few thousandths of a nat are noise"]
    return write_table(out, "lora", "Laplace-LoRA against the fine-tuned MAP",
                       [("nll", "NLL per byte"), ("ece", "ECE"), ("accuracy", "accuracy"), ("auroc", "OOD AUROC")],
                       r["rows"], notes, {"settings": r["settings"], "times": t, "seed": args.seed})


def _seeds(command, args, out: Path, log) -> str:
    """``projected`` or ``inbetween`` once per seed, each into ``out/seed<k>/``, and the mean ± standard error of
    every table entry over them (`write_seed_table`); returns its Markdown."""
    import json

    from posteriors.experiments import classification, inbetween
    from posteriors.experiments._common import write_seed_table

    per_seed, seeds = [], [args.seed + k for k in range(args.seeds)]
    for seed in seeds:
        log(f"seed {seed} ({len(per_seed) + 1} of {len(seeds)})")
        cfg = dataclasses.replace(args.config, seed=seed)
        module = classification if command == "projected" else inbetween
        per_seed.append(module.run(cfg, out / f"seed{seed}", log, name=command)["rows"])
    record = json.loads((out / f"seed{seeds[-1]}" / f"{command}.json").read_text())
    config = dict(record["meta"]["config"], seed=seeds)
    return write_seed_table(out, f"{command}_seeds", record["title"], list(record["columns"].items()), per_seed,
                            [f"Seeds {', '.join(map(str, seeds))}: each seed's table, notes and figures in "
                             "seed<k>/."], {"config": config})


def _subnetwork_seeds(args, out: Path, size: str, log) -> str:
    """``subnetwork``'s rotated part once per seed, each into ``out/seed<k>/``, and the mean ± standard error over
    them of every method's log-likelihood at each angle and over the angles, and its error at 0°
    (`write_seed_table`: ``subnetwork_rotated_seeds``); returns its Markdown."""
    import numpy as np

    from posteriors.experiments import subnetwork
    from posteriors.experiments._common import write_seed_table

    per_seed, seeds = [], [args.seed + k for k in range(args.seeds)]
    for seed in seeds:
        log(f"seed {seed} ({len(per_seed) + 1} of {len(seeds)})")
        rm = subnetwork.run(out / f"seed{seed}", size, log, parts=("rotated",), seed=seed)["rotated_mnist"]
        per_seed.append({name: {**{f"ll_{a}": v for a, v in zip(rm["angles"], res["log_likelihood"], strict=True)},
                                "ll_mean": float(np.mean(res["log_likelihood"])), "error_0": res["error"][0]}
                         for name, res in rm["results"].items()})
    columns = ([(f"ll_{a}", f"LL {a}°") for a in rm["angles"]] + [("ll_mean", "LL, mean over angles"),
                                                                   ("error_0", "error at 0°")])
    title = (f"Rotated MNIST (LeNet-5, {rm['num_params']} parameters; subnetworks of {rm['subnetwork_size']}): test "
             "log-likelihood by angle")
    return write_seed_table(out, "subnetwork_rotated_seeds", title, columns, per_seed,
                            [f"Seeds {', '.join(map(str, seeds))}: each seed's network, subnetworks, SWAG and "
                             "ensemble (seed s: the size sweep's network s), on one data split; each seed's "
                             "summary and figure in seed<k>/."], {"config": {"size": size, "seed": seeds}})


def _subnetwork_text(summary) -> str:
    lines = ["## Subnetwork inference"]
    if "toy_regression" in summary:
        toy = summary["toy_regression"]
        lines += ["", f"Toy regression ({toy['num_weights']} weights; {toy['weights_without_data_gradient']} without "
                  "data gradient): predictive std against the full covariance's", "",
                  "| method | size | std in gap | std on data | error vs full |", "|---|---:|---:|---:|---:|"]
        for name, v in toy["methods"].items():
            err = f"{v['error_vs_full']:.3f}" + (f" ± {v['error_vs_full_sd']:.3f}" if "error_vs_full_sd" in v else "")
            lines.append(f"| {name} | {v['size'] if v['size'] is not None else '—'} | {v['mean_std_in_gap']:.3f} | "
                         f"{v['mean_std_on_data']:.3f} | {err} |")
    for key, title in (("rotated_mnist", "subnetworks of {subnetwork_size}"),
                       ("size_sweep", "subnetworks by size, mean ± s.e. over {seeds} seeds")):
        if key not in summary:
            continue
        rm = summary[key]
        rows = rm.get("results") or rm["rows"]
        lines += ["", f"Rotated MNIST (LeNet-5, {rm['num_params']} parameters; {title.format(**rm)}): test "
                  "log-likelihood by angle", "", "| method | " + " | ".join(f"{a}°" for a in rm["angles"]) + " |",
                  "|---|" + "---:|" * len(rm["angles"])]
        for name, res in rows.items():
            ll = res["log_likelihood"]
            se = res.get("log_likelihood_se") if rm.get("seeds", 1) > 1 else None
            cells = [f"{v:.2f}" + (f" ± {se[i]:.2f}" if se else "") for i, v in enumerate(ll)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["COMMANDS", "build_parser", "main"]
