"""Identifiers (adapter ids, GPU type names, profile names) in instances, adapter and trace
CSVs and plans: NFC-normalised, so ids that differ only in Unicode normalisation are one id
(a list holding both is refused as a duplicate), and refused when they hold a control or
format character (NUL, ESC, U+202E RIGHT-TO-LEFT OVERRIDE, zero-width space, ...): one line
``error: <file or field>: <reason and the bad value>``, exit 2, no output file."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from optim.cli import main as optim_main
from optim.placement import Placement
from twin.cli import main as twin_main
from twin.identifiers import clean_identifier, identifier
from twin.workload import Adapter, load_adapters_csv, load_trace_csv

LLAMA = "llama-3.1-8b-instruct"
NFC = "caf\u00e9"            # é as one code point
NFD = "cafe\u0301"           # e + combining acute accent
assert NFC != NFD and unicodedata.normalize("NFC", NFD) == NFC


def refused_one_line(main, argv, capsys, out: Path | None = None) -> str:
    """Exit 2, stderr exactly one line ``error: ...``, no traceback, no output file."""
    try:
        rc = main([str(x) for x in argv])
    except SystemExit as e:
        rc = e.code
    _, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    if out is not None:
        assert not out.exists()
    return lines[0]


def instance(tmp_path: Path, adapters=None, gpu_name: str = "h100") -> Path:
    d = {"name": "ids", "adapters": adapters or [{"id": "a0", "rank": 8, "rate": 1.0}],
         "gpus": [{"name": gpu_name, "profile": LLAMA, "count": 2}], "duration_s": 60}
    p = tmp_path / "inst.json"
    p.write_text(json.dumps(d), encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- the helper
@pytest.mark.parametrize("text, code", [("a\x00b", "U+0000 (NUL)"),
                                        ("gpu\u202e001h", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
                                        ("a\u200bb", "U+200B (ZERO WIDTH SPACE)"),
                                        ("a\x1b[31mb", "U+001B (ESCAPE)"),
                                        ("a\nb", "U+000A (LINE FEED)"),
                                        ("a\u2028b", "U+2028 (LINE SEPARATOR)")])
def test_control_and_format_characters_are_refused_naming_field_and_character(text, code):
    with pytest.raises(ValueError) as e:
        clean_identifier(text, "gpus[0].name", what="GPU type name")
    msg = str(e.value)
    assert msg.startswith("gpus[0].name: GPU type name ") and code in msg
    assert repr(text) in msg and "\n" not in msg          # the value, escaped, on one line


def test_ids_are_nfc_normalised():
    assert identifier(NFD) == NFC
    assert Adapter(NFD, 8, 1.0).id == NFC
    assert identifier("plain-id_1.x") == "plain-id_1.x"
    with pytest.raises(ValueError, match="non-empty"):
        identifier("   ")


# ----------------------------------------------------------------------------- instances
def test_instance_ids_differing_only_in_normalisation_are_duplicates(tmp_path, capsys):
    inst = instance(tmp_path, [{"id": NFC, "rank": 8, "rate": 1.0},
                               {"id": NFD, "rank": 8, "rate": 1.0}])
    out = tmp_path / "out.json"
    line = refused_one_line(optim_main, ["solve", inst, "--method", "greedy", "--json", out],
                            capsys, out)
    assert line == (f"error: {inst}: field 'adapters[1].id': duplicate adapter id '{NFC}' "
                    "(first at adapters[0])")


@pytest.mark.parametrize("name, code", [("h100\x00", "U+0000 (NUL)"),
                                        ("h\u202e001", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
                                        ("h100\u200d", "U+200D (ZERO WIDTH JOINER)")])
def test_instance_gpu_type_name_with_control_characters_is_refused(name, code, tmp_path, capsys):
    inst = instance(tmp_path, gpu_name=name)
    out = tmp_path / "out.json"
    line = refused_one_line(optim_main, ["solve", inst, "--method", "greedy", "--json", out],
                            capsys, out)
    assert line.startswith(f"error: {inst}: field 'gpus[0].name': GPU type name {name!r} "
                           f"contains the control/format character {code} at position ")


def test_instance_adapter_id_with_a_control_character_is_refused(tmp_path, capsys):
    inst = instance(tmp_path, [{"id": "a\x1b[2Jb", "rank": 8, "rate": 1.0}])
    line = refused_one_line(optim_main, ["solve", inst, "--method", "greedy"], capsys)
    assert "field 'adapters[0].id': adapter id 'a\\x1b[2Jb'" in line and "U+001B" in line


# ----------------------------------------------------------------------------- CSVs
def test_adapters_csv_normalisation_duplicates_are_refused(tmp_path, capsys):
    csv = tmp_path / "ad.csv"
    csv.write_text(f"id,rank,rate\n{NFC},8,0.1\n{NFD},8,0.1\n", encoding="utf-8")
    out = tmp_path / "run.json"
    line = refused_one_line(twin_main, ["run", "--adapters-file", csv, "--json", out], capsys,
                            out)
    assert line == f"error: ad.csv row 2, column 'id': duplicate adapter id '{NFC}' (first in row 1)"


def test_adapters_csv_control_character_is_refused_with_its_row(tmp_path, capsys):
    csv = tmp_path / "ad.csv"
    csv.write_text("id,rank,rate\na,8,0.1\nb\u202ec,8,0.1\n", encoding="utf-8")
    line = refused_one_line(twin_main, ["run", "--adapters-file", csv], capsys)
    assert line.startswith("error: ad.csv row 2, column 'id': id 'b\\u202ec' contains the "
                           "control/format character U+202E (RIGHT-TO-LEFT OVERRIDE)")


def test_instance_adapters_csv_goes_through_the_same_rule(tmp_path, capsys):
    (tmp_path / "ad.csv").write_text(f"id,rank,rate\n{NFD},8,0.1\n{NFC},8,0.1\n",
                                     encoding="utf-8")
    d = {"name": "csv", "adapters": "ad.csv", "gpus": [{"name": "h", "profile": LLAMA,
                                                        "count": 1}]}
    inst = tmp_path / "inst.json"
    inst.write_text(json.dumps(d))
    line = refused_one_line(optim_main, ["solve", inst, "--method", "greedy"], capsys)
    assert "field 'adapters': ad.csv row 2, column 'id': duplicate adapter id" in line


HEADER = "arrival_s,adapter_id,input_tokens,output_tokens,rank\n"


def test_trace_ids_are_normalised_to_one_adapter(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + f"1,{NFC},10,10,8\n2,{NFD},10,10,8\n", encoding="utf-8")
    adapters, reqs = load_trace_csv(trace, duration_s=10)
    assert [a.id for a in adapters] == [NFC] and len(reqs) == 2
    adapters, reqs = load_trace_csv(trace, adapters=[Adapter(NFD, 8, 0.2)])
    assert adapters[0].id == NFC and list(reqs.adapter) == [0, 0]


def test_trace_control_character_is_refused_with_its_row(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "1,a,10,10,8\n2,a\x7f,10,10,8\n", encoding="utf-8")
    line = refused_one_line(twin_main, ["run", "--trace", trace], capsys)
    assert line.startswith("error: t.csv row 2, column 'adapter_id': id 'a\\x7f' contains")
    with pytest.raises(ValueError, match="row 2, column 'adapter_id'"):
        load_trace_csv(trace, duration_s=10)
    csv = tmp_path / "ad.csv"
    csv.write_text("id,rank,rate\na\x00,8,0.1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ad.csv row 1, column 'id': id 'a\\x00' contains"):
        load_adapters_csv(csv)


# ----------------------------------------------------------------------------- plans
def _plan(gpu_type: str = "h100", ids=("a0",)) -> dict:
    return {"instance": "p", "method": "greedy", "status": "solved", "wall_time_s": 0.1,
            "objective": "gpus",
            "gpus": [{"gpu_type": gpu_type, "profile": LLAMA, "max_loras": 8,
                      "max_lora_rank": 8, "offered_tps": 10.0,
                      "adapters": [{"id": i, "rank": 8, "rate": 0.1, "share": 1.0}
                                   for i in ids]}]}


def test_plan_loading_refuses_control_characters_and_normalises_ids():
    with pytest.raises(ValueError) as e:
        Placement.from_dict(_plan(gpu_type="h100\u202e"))
    assert str(e.value).startswith("gpus[0].gpu_type: GPU type name 'h100\\u202e' contains")
    p = Placement.from_dict(_plan(ids=(NFD,)))
    assert p.gpus[0].adapters[0][0].id == NFC
    p = Placement.from_dict(_plan(ids=(NFC, NFD)))      # one id twice: the readers refuse it
    assert [a.id for a, _ in p.gpus[0].adapters] == [NFC, NFC]


def test_optim_deploy_refuses_a_plan_listing_one_id_in_two_normalisations(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(ids=(NFC, NFD))), encoding="utf-8")
    out = tmp_path / "out"
    line = refused_one_line(optim_main, ["deploy", plan, "--out", out], capsys)
    assert line == f"error: {plan}: gpu 0: adapter '{NFC}': listed twice on this GPU"
    assert not out.exists()


def test_twin_derive_refuses_a_gpu_spec_name_with_control_characters(tmp_path, capsys):
    spec = {"name": "evil\u202eGPU", "memory_gib": 80, "hbm_bandwidth_gbs": 3350,
            "bf16_dense_tflops": 989, "host_link_gbs": 64, "tdp_w": 700, "idle_w": 100}
    p = tmp_path / "mygpu.json"
    p.write_text(json.dumps(spec))
    out = tmp_path / "derived.json"
    line = refused_one_line(twin_main, ["derive", "--gpu", p, "--model", LLAMA, "--out", out],
                            capsys, out)
    assert line.startswith("error: --gpu mygpu: name 'evil\\u202eGPU' contains the "
                           "control/format character U+202E (RIGHT-TO-LEFT OVERRIDE)")
