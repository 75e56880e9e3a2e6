"""Exact minimum-GPU placement: MILP (Pyomo + HiGHS) and CP-SAT (OR-Tools) over one problem.

Modules (one concept each):

* ``problem``   — the packing problem both solvers read: adapters as integer load units,
  GPU slots with their type, the configurations (pieces) each type may take, identical-adapter
  groups, no-good cuts; GPU-level evaluation used by brute force and checks.
* ``capacity``  — where configurations come from: the surrogate's encodable ``CapacityModel``
  (trained per profile), a provisional twin-measured table, or the instance's constant capacity.
* ``bounds``    — lower bounds independent of the solvers (capacity L1, Martello–Toth L2,
  LP relaxation).
* ``milp``      — the Pyomo model, one function per constraint family, solved with HiGHS.
* ``cpsat``     — the same decisions and families in CP-SAT.
* ``brute``     — exhaustive enumeration for tiny instances (tests).
* ``loop``      — twin in the loop: solve, verify in the fleet twin, cut starving GPUs, re-solve.
* ``register``  — ``milp``, ``cpsat`` and ``auto`` in the method registry.
"""
