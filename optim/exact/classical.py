"""Classical bin-packing files as placement instances (constant capacity), for benchmarks.

Two public formats are read:

* **BPPLIB** (Delorme, Iori & Martello 2018): one instance per file — item count, capacity,
  then one weight per line;
* **OR-Library** ``binpack*.txt`` (Beasley): a count of problems, then per problem its name,
  a line ``capacity items best-known``, and the weights.

``classical_instance`` turns one into an instance document: one GPU type with the constant
capacity ``capacity`` tok/s (``capacity_tps``; the exact methods then solve bin packing), one
rank-8 adapter per item offering ``weight`` tok/s (rate = weight / mean tokens per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MEAN_INPUT, MEAN_OUTPUT = 223.0, 196.3


@dataclass(frozen=True)
class BinPackingFile:
    """One classical instance: name, capacity, integer weights, and the value its file states
    (OR-Library's best known; ``None`` for BPPLIB files, whose optima are listed apart)."""

    name: str
    capacity: int
    weights: tuple[int, ...]
    stated_best: int | None = None


def read_bin_packing(path: str | Path) -> list[BinPackingFile]:
    """Every instance in a BPPLIB or OR-Library file (``ValueError`` naming the file when it
    is neither)."""
    path = Path(path)
    try:
        tok = path.read_text().split()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read a bin-packing file ({e})") from None
    try:
        if len(tok) >= 2 and not tok[1].lstrip("-").isdigit():      # OR-Library
            out, k = [], 1
            for _ in range(int(tok[0])):
                name = tok[k]
                cap, n, best = (int(v) for v in tok[k + 1:k + 4])
                out.append(BinPackingFile(name, cap, tuple(int(v) for v in tok[k + 4:k + 4 + n]),
                                          best))
                k += 4 + n
            return out
        n, cap = int(tok[0]), int(tok[1])
        weights = tuple(int(v) for v in tok[2:2 + n])
        if len(weights) != n:
            raise ValueError(f"states {n} items, holds {len(weights)}")
        return [BinPackingFile(path.stem, cap, weights)]
    except (ValueError, IndexError) as e:
        raise ValueError(f"{path}: not a BPPLIB or OR-Library bin-packing file ({e})") from None


def classical_instance(bp: BinPackingFile, profile: str = "llama-3.1-8b-instruct") -> dict:
    """The instance document of a classical instance (module docstring)."""
    mean = MEAN_INPUT + MEAN_OUTPUT
    return {"schema_version": 1, "name": bp.name,
            "description": f"classical bin packing: {len(bp.weights)} items, capacity "
                          f"{bp.capacity}",
            "gpus": [{"name": "bin", "profile": profile, "count": len(bp.weights),
                      "price_per_hour": 1.0, "capacity_tps": bp.capacity, "capacity_amax": 8}],
            "lengths": {"mean_input": MEAN_INPUT, "mean_output": MEAN_OUTPUT},
            "objective": "gpus",
            "adapters": [{"id": f"i{k}", "rank": 8, "rate": w / mean}
                         for k, w in enumerate(bp.weights)]}
