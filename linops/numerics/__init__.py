"""Iterative numerics on operators: Lanczos and its low-rank factors (progress bars from
`linops.runtime`); the public names are `linops`'s."""
