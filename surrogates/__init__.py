"""Surrogates of one GPU's behaviour, learned from the digital twin (issue 3, DESIGN.md §5).

Modules (one concept each):

* ``features``  — GPU features: additive per-adapter sums (``adapter_feature_vector``), max
  rank, Amax; the column list ``FEATURES`` shared by every model and optimiser;
* ``dataset``   — scenario sampling and the resumable, seeded Parquet build (local pool or Ray);
* ``memory``    — KV capacity / memory errors from the profile's table (exact);
* ``domain``    — input validation and the trained domain (extrapolation is flagged);
* ``trees``     — tree ensembles as plain arrays + numba predictor (no pickles);
* ``oblivious`` — boosted oblivious trees (branch-free) for the fast model;
* ``models``    — ``ThroughputRegressor``, ``StarvationClassifier``, ``ItlRegressor``
  (scikit-learn estimator contract);
* ``fast``      — ``FastModel``: distilled, numba, sub-microsecond per GPU in batch;
* ``encodable`` — ``CapacityModel``: piecewise-constant load caps per (max rank, Amax, N range)
  that MILP / CP-SAT encode exactly (``pieces()``);
* ``train`` / ``evaluate`` / ``cli`` — ``python -m surrogates build | train | evaluate``.

Trained models for the shipped profiles live in ``surrogates/trained/<profile>/``
(``manifest.json`` lists the commands that regenerate them).
"""

from pathlib import Path as _Path

from twin.numba_cache import refresh_stale as _refresh_stale

_refresh_stale(_Path(__file__).parent)   # numba caches compiled against older sources
