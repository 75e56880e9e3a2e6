"""Test profiles with few slots: the shipped Llama profile whose KV table stops at Amax 4, so
that more than four adapters on one GPU must swap (the regime of the one-GPU and fullest-GPU
bound checks) with instances small enough for unit tests."""

from __future__ import annotations

import json
from pathlib import Path

from twin.profile import load_profile

LLAMA = "llama-3.1-8b-instruct"


def four_slot_profile(directory: Path) -> str:
    """Write the four-slot profile (ranks 8 and 16, the KV of Amax 8) into ``directory``;
    returns its path for an instance's ``profile`` field."""
    d = load_profile(LLAMA).to_dict()
    d["kv_capacity"] = {"4,8": d["kv_capacity"]["8,8"], "4,16": d["kv_capacity"]["8,16"]}
    d["name"] = "llama-four-slots"
    path = Path(directory) / "four-slots.json"
    path.write_text(json.dumps(d))
    return str(path)
