"""The experiments behind ``python -m posteriors``: each paper's comparison on data that needs no download.

- `classification`: calibration and OOD detection on real images (projected-Bayes tables 2-3);
- `inbetween`: in-between uncertainty on a 1-D toy (projected-Bayes figure 4);
- `subnetwork`: subnetwork inference's toy regression and rotated digits (figures 2 and 4);
- `fsp`: FSP-Laplace's toy problems (figure 1, C.5-C.6) and Mauna Loa CO2 (table 1).

They need the ``examples`` extra (``pip install -e ".[examples]"``). See `posteriors.experiments.cli`.
"""
