"""``python -m posteriors``: the command line, an application of the library (`posteriors.experiments.cli`)."""

from posteriors.experiments.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
