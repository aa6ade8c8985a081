"""The Laplace kinds the tests sweep, as `posteriors.laplace`'s two axes (which weights x which structure)."""

AXES = {
    "full": {"structure": "full"},
    "diag": {"structure": "diag"},
    "kfac": {"structure": "kfac"},
    "lowrank": {"structure": "lowrank"},
    "last_layer": {"structure": "full", "subset_of_weights": "last_layer"},
}


def axes(kind: str) -> dict:
    """``laplace``'s keyword arguments of a kind named as the tests' parameters name it (``"last_layer"``: the full
    GGN of the last layer)."""
    return dict(AXES[kind])
