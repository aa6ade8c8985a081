"""posteriors: Laplace-family posteriors built on `linops` (methods land with later issues)."""

__version__ = "0.1.0"
