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


def test_cached_reads_parse_a_file_again_only_after_it_changed(tmp_path, monkeypatch):
    """``read_json_cached`` parses once per version of the file: lookups between writes reuse
    the parsed entries, a write (even by another process: a new file) is seen at once."""
    import optim.disk_cache as D
    path = tmp_path / "c.json"
    assert D.read_json_cached(path) == {}
    D.update_json(path, {"a": 1})
    parsed = []
    real = D.read_json
    monkeypatch.setattr(D, "read_json", lambda p: parsed.append(p) or real(p))
    assert D.read_json_cached(path) == {"a": 1}
    assert D.read_json_cached(path) == {"a": 1} and len(parsed) == 1
    D.update_json(path, {"b": 2})             # parses once under the lock to merge
    assert D.read_json_cached(path) == {"a": 1, "b": 2} and len(parsed) == 3


def test_a_file_holds_one_entry_per_line_in_key_order(tmp_path):
    """Each entry on its own line, keys sorted: a committed store changes by the lines of the
    entries that changed; the file reads back as the same object."""
    path = tmp_path / "s.json"
    update_json(path, {"b": {"x": [1, 2]}, "a": {"y": 1}})
    update_json(path, {"c": {}})
    lines = path.read_text().splitlines()
    assert lines == ["{", '"a": {"y": 1},', '"b": {"x": [1, 2]},', '"c": {}', "}"]
    assert read_json(path) == {"a": {"y": 1}, "b": {"x": [1, 2]}, "c": {}}
