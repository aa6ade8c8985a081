"""The algebra: operators, composites, closed forms, functions, tags, rewrite rules, lowering, CG.

Nothing here imports `linops.runtime`, `linops.nn`, `linops.numerics` or `linops.kernels`
(`tests/test_layout.py`); the public names are `linops`'s."""
