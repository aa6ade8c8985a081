"""Interoperability with other libraries: lineax; the public names are `linops`'s."""
