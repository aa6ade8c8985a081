"""The methods the experiments compare, and each command's default set. Imports nothing heavy: the
command line's help reads them.

Examples:
    >>> from posteriors.experiments.methods import DEFAULT_METHODS, METHODS
    >>> "full" in METHODS, "full" in DEFAULT_METHODS
    (True, False)
"""

METHODS = ("map", "full", "diag", "last_layer", "kfac", "lowrank", "subnetwork", "projected", "loss_projected",
           "fsp")
"""Every method of the classification and in-between experiments."""

LABELS = {"map": "MAP", "full": "Full Laplace", "diag": "Diagonal Laplace", "last_layer": "Last-layer Laplace",
          "kfac": "KFAC Laplace", "lowrank": "Low-rank Laplace", "subnetwork": "Subnetwork Laplace",
          "projected": "Projected", "loss_projected": "Loss-projected", "fsp": "FSP-Laplace"}
"""How tables and figures name each method."""

DEFAULT_METHODS = tuple(m for m in METHODS if m != "full")
"""``demo``'s methods: all but full Laplace (its ``P x P`` matrix)."""

PROJECTED_METHODS = ("map", "diag", "last_layer", "kfac", "projected", "loss_projected")
"""``projected``'s methods: the projected-Bayes paper's comparison."""
