"""Exact minimum-GPU placement: MILP (Pyomo + HiGHS) and CP-SAT (OR-Tools) over one problem.

Modules (one concept each):

* ``problem``   — the packing problem both solvers read: adapters as integer load units,
  GPU slots with their type, the configurations (pieces) each type may take, identical-adapter
  groups, no-good cuts; GPU-level evaluation used by brute force and checks.
* ``capacity``  — where configurations come from: the surrogate's encodable ``CapacityModel``
  (trained per profile), a provisional twin-measured table, or the instance's constant capacity.
* ``bounds``    — lower bounds independent of the solvers (capacity L1, Martello–Toth L2,
  LP relaxation).
* ``first_fit`` — first/best-fit decreasing over the problem's own configurations (starts).
* ``arcflow``   — the arc-flow model (CP-SAT and HiGHS) where GPUs are limited by load alone, its
  LP relaxation (Gilmore–Gomory bound) and the LP pattern dive.
* ``classical`` — BPPLIB / OR-Library bin-packing files as constant-capacity instances.
* ``milp``      — the Pyomo model, one function per constraint family, solved with HiGHS.
* ``cpsat``     — the same decisions and families in CP-SAT.
* ``brute``     — exhaustive enumeration for tiny instances (tests).
* ``loop``      — the method under one deadline: bounds, starts, model choice, and the twin in
  the loop (solve, verify in the fleet twin, cut starving GPUs, re-solve; greedy's accepted
  placement as incumbent; claims).
* ``register``  — ``milp``, ``cpsat`` and ``auto`` in the method registry.
"""

from pathlib import Path as _Path

from twin.numba_cache import refresh_stale as _refresh_stale

_refresh_stale(_Path(__file__).parent)   # numba caches compiled against older sources
