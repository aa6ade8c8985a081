"""``python -m posteriors``: see `posteriors.cli`."""

from posteriors.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
