"""The methods the experiments compare, and each command's default set. Imports nothing heavy: the
command line's help reads them.

Examples:
    >>> from posteriors.experiments.methods import CLASSIFICATION_METHODS, DEFAULT_METHODS, METHODS
    >>> "full" in METHODS, "full" in DEFAULT_METHODS, "swag" in CLASSIFICATION_METHODS
    (True, False, True)
"""

METHODS = ("map", "full", "diag", "last_layer", "kfac", "lowrank", "subnetwork", "projected", "loss_projected",
           "fsp")
"""The posteriors around one MAP network, every method of the in-between experiment."""

CLASSIFICATION_METHODS = METHODS + ("swag", "ensemble")
"""Every method of the classification experiments (``demo``, ``projected``): `METHODS` and the projected-Bayes
paper's baselines, SWAG and a deep ensemble."""

LABELS = {"map": "MAP", "full": "Full Laplace", "diag": "Diagonal Laplace", "last_layer": "Last-layer Laplace",
          "kfac": "KFAC Laplace", "lowrank": "Low-rank Laplace", "subnetwork": "Subnetwork Laplace",
          "projected": "Projected", "loss_projected": "Loss-projected", "fsp": "FSP-Laplace", "swag": "SWAG",
          "ensemble": "Deep ensemble"}
"""How tables and figures name each method."""

LAPLACE_AXES = {"full": {"structure": "full"}, "diag": {"structure": "diag"}, "kfac": {"structure": "kfac"},
                "last_layer": {"structure": "full", "subset_of_weights": "last_layer"}}
"""The Laplace methods fitted by one `posteriors.laplace` call, as its two axes (which structure, which weights)."""

DEFAULT_METHODS = tuple(m for m in METHODS if m != "full")
"""``demo``'s methods: all of `METHODS` but full Laplace (its ``P x P`` matrix)."""

PROJECTED_METHODS = ("map", "projected", "loss_projected", "swag", "last_layer", "diag", "ensemble")
"""``projected``'s methods: the rows of the projected-Bayes paper's tables 2-3, in its order, and the deep
ensemble of its table 5."""

WIDE_PRIOR_GRID = tuple(10.0**k for k in range(-4, 5))
"""The subnetwork paper's range for its baselines' prior precision (appendix D.3: 1e-4 to 1e4, then a fine grid
around the best: `posteriors.experiments._common.grid_search`)."""

SWAG_GRID = tuple((lr, wd) for lr in (1e-3, 3e-3, 1e-2, 3e-2) for wd in (3e-4, 3e-3, 3e-2))
"""SWAG's (learning rate, weight decay) candidates, chosen by validation NLL (`posteriors.experiments._common.
swag_search`; the subnetwork paper's appendix D.3 tuned SWAG too): the projected paper's fixed (1e-2, 3e-4) among
them."""
