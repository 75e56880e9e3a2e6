"""The user's cache files keep every entry when several processes add to them at once."""

import json
import multiprocessing as mp

from optim.disk_cache import read_json, update_json


def _writer(args):
    path, who, n = args
    for i in range(n):
        update_json(path, {f"{who}-{i}": {"v": i}})


def test_concurrent_writers_keep_every_entry(tmp_path):
    path = tmp_path / "carry_limits.json"
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.map(_writer, [(path, f"w{w}", 40) for w in range(4)])
    data = read_json(path)
    assert len(data) == 160
    assert data["w3-39"] == {"v": 39}
    assert not list(tmp_path.glob("*.tmp"))          # every temporary file replaced the cache


def test_unreadable_file_reads_empty_and_is_replaced(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{ half a file")
    assert read_json(path) == {}
    update_json(path, {"k": 1})
    assert json.loads(path.read_text()) == {"k": 1}


def test_cache_put_goes_through_the_lock(tmp_path, monkeypatch):
    from optim import capacity
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    capacity._disk_put("a", {"x": 1})
    capacity._disk_put("b", {"x": 2})
    assert capacity._disk_get("a") == {"x": 1} and capacity._disk_get("b") == {"x": 2}
    assert (tmp_path / "carry_limits.json.lock").exists()
