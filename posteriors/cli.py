"""The command line: ``python -m posteriors [demo|projected|inbetween|subnetwork|fsp] [options]``.

``demo`` (the default) trains a small tanh MLP on scikit-learn's digits 0-4, fits every posterior
around it (MAP, diagonal, last-layer, KFAC, low-rank, subnetwork, projected, loss-projected and
FSP-Laplace), prints the comparison table (confidence, NLL, accuracy, Brier, ECE, MCE and OOD
AUROC against the held-out digits 5-9, noise images and rotated digits), and writes it as JSON
and Markdown with figures (reliability diagrams, OOD score histograms, a rotation shift, and the
in-between uncertainty of a 1-D toy) into ``--out``. The other commands reproduce one paper's
comparison each. ``--quick`` finishes in a few minutes on 2 CPU cores.

Examples:
    >>> from posteriors.cli import build_parser
    >>> args = build_parser().parse_args(["demo", "--quick", "--methods", "map,projected"])
    >>> args.command, args.quick, args.methods
    ('demo', True, 'map,projected')
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from posteriors.experiments.methods import DEFAULT_METHODS, METHODS, PROJECTED_METHODS

COMMANDS = {
    "demo": "every posterior on digits 0-4: the comparison table, figures, and the in-between toy",
    "projected": "the projected-Bayes paper's tables 2-3 and figure 6 (MNIST subset by default)",
    "inbetween": "in-between uncertainty on a 1-D toy regression (projected-Bayes figure 4)",
    "subnetwork": "subnetwork inference: toy regression and rotated digits (figures 2 and 4)",
    "fsp": "FSP-Laplace: toy regression, two moons, Mauna Loa CO2 (figure 1, C.5-C.6, table 1)",
}
"""The commands of ``python -m posteriors``, with a line on what each reproduces."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m posteriors``.

    Examples:
        >>> from posteriors.cli import build_parser
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
        if name in ("demo", "projected", "inbetween"):
            chosen = {"demo": DEFAULT_METHODS, "projected": PROJECTED_METHODS, "inbetween": METHODS}[name]
            p.add_argument("--methods", help=f"comma-separated methods, from: {', '.join(METHODS)} (default: "
                                             f"{'all' if chosen == METHODS else ', '.join(chosen)})")
        if name == "fsp":
            p.add_argument("--parts", default="regression,two_moons,maunaloa",
                           help="comma-separated parts (default: %(default)s)")
    _common_options(parser)
    parser.add_argument("--dataset", choices=["digits", "mnist"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--methods", help=argparse.SUPPRESS)
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


def _classification_config(args, command):
    from posteriors.experiments.classification import Config

    methods = _methods(args.methods, METHODS, command)
    if methods is None:
        methods = DEFAULT_METHODS if command == "demo" else PROJECTED_METHODS
    dataset = args.dataset or ("digits" if command == "demo" else "mnist")
    cfg = Config(dataset=dataset, methods=methods, seed=args.seed)
    if dataset == "mnist":
        cfg = dataclasses.replace(cfg, width=64, batch_size=128, steps=4000, fsp_context=200)
    if args.quick:
        cfg = dataclasses.replace(cfg, steps=1000, num_samples=30, projection_sweeps=200, fsp_steps=600,
                                  marglik_steps=50, angles=(0, 45, 90, 180),
                                  max_train=1000 if dataset == "mnist" else None)
    if args.smoke:
        cfg = dataclasses.replace(cfg, max_train=150, max_test=100, width=16, steps=200, num_samples=10,
                                  projection_sweeps=30, fsp_steps=50, fsp_context=20, marglik_steps=10, lowrank=5,
                                  angles=(0, 90))
    return cfg


def _inbetween_config(args):
    from posteriors.experiments.inbetween import Config

    cfg = Config(seed=args.seed, methods=_methods(args.methods, METHODS, "inbetween") or METHODS)
    if args.quick:
        cfg = dataclasses.replace(cfg, steps=2000, fsp_steps=1000)
    if args.smoke:
        cfg = dataclasses.replace(cfg, n=30, width=16, steps=200, fsp_steps=50)
    return cfg


def _parts(text):
    known = ("regression", "two_moons", "maunaloa")
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in known]
    if bad or not parts:
        raise SystemExit(f"python -m posteriors fsp: unknown part(s) {bad or [text]}; choose from {', '.join(known)}")
    return parts


DEFAULT_CACHE = Path.home() / ".cache" / "linops" / "jax"


def use_compilation_cache(directory) -> Path | None:
    """Switch on JAX's persistent compilation cache in ``directory`` (``None`` or ``"none"``: leave it off).

    The command line calls it once, before any work: a second run of the same experiment reads its compiled
    programs back instead of compiling them again. The library itself never sets it (no global configuration
    at import); call this, or ``jax.config.update("jax_compilation_cache_dir", ...)``, in your own scripts.
    Programs that compiled in under 0.1 s are not written. Returns the directory used, or None.

    Examples:
        >>> import tempfile
        >>> from posteriors.cli import use_compilation_cache
        >>> use_compilation_cache("none") is None
        True
    """
    if directory is None or str(directory).lower() == "none":
        return None
    import jax

    path = Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    return path


def main(argv=None) -> int:
    """Run ``python -m posteriors`` with ``argv`` (default: the process's arguments); returns the exit code.

    Bad arguments (an unknown command, method, dataset or part) stop it before any work.

    Examples:
        >>> from posteriors.cli import main
        >>> main(["fsp", "--parts", "sine"])
        Traceback (most recent call last):
        ...
        SystemExit: python -m posteriors fsp: unknown part(s) ['sine']; choose from regression, two_moons, maunaloa
    """
    args = build_parser().parse_args(argv)
    command = args.command or "demo"
    if command in ("demo", "projected"):
        args.config = _classification_config(args, command)
    elif command == "inbetween":
        args.config = _inbetween_config(args)
    elif command == "fsp":
        args.config = _parts(args.parts)
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
    if command in ("demo", "projected"):
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

        summary = subnetwork.run(out, quick, log)
        print(_subnetwork_text(summary))
    elif command == "fsp":
        from posteriors.experiments import fsp

        summary = fsp.run(out, quick, log, parts=args.config)
        if "maunaloa" in summary:
            print(summary["maunaloa"]["markdown"])
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    print(f"\nwrote to {out}/: {', '.join(files)}")
    return 0


def _subnetwork_text(summary) -> str:
    lines = ["## Subnetwork inference", "", "Toy regression: mean predictive std in the gap", ""]
    for name, v in summary["toy_regression"]["methods"].items():
        lines.append(f"- {name}: {v['mean_std_in_gap']:.3f}")
    rd = summary["rotated_digits"]
    lines += ["", f"Rotated digits (subnetworks of {rd['subnetwork_size']} of {rd['num_params']} weights): "
              "test log-likelihood by angle", "", "| method | " + " | ".join(f"{a}°" for a in rd["angles"]) + " |",
              "|---|" + "---:|" * len(rd["angles"])]
    for name, res in rd["results"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in res["log_likelihood"]) + " |")
    return "\n".join(lines)


__all__ = ["COMMANDS", "build_parser", "main", "use_compilation_cache"]
