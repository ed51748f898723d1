"""No input breaks the tool: every command and library entry point answers bad input with exit code 2 and
one line naming what is wrong (never a traceback, never a silent fix-up), and `predict` answers every line of a
JSON Lines file. The property tests draw from the whole scenario schema with bounded examples (CI); the hand-run
benchmarks/fuzz_inputs.py pushes 1,000 inputs through the same checks."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import perfpredict
from perfpredict.cli import app
from perfpredict.core import Cluster, PerfPredictError, Workload, get_gpu
from perfpredict.predictor.predict import PredictionError

runner = CliRunner()
BASE = json.loads(open("examples/scenario-8b-dpo.json").read())
# The type each field accepts: a value of another type must be refused (no coercion: true is not 1, 2.0 is not 2).
FIELD_TYPES = {
    "workload": {"objective": "str", "seq_len": "int", "global_batch": "int", "dataset_size": "int",
                 "epochs": "num", "precision": "str", "master_weights_fp32": "bool", "reference": "str"},
    "plan": {"tp": "int", "pp": "int", "dp": "int", "cp": "int", "sequence_parallel": "bool", "zero": "int",
             "recompute": "str", "micro_batch": "int", "grad_accum": "int", "optimizer_offload": "bool",
             "framework": "str", "schedule": "str", "virtual_stages": "int", "ep": "int", "param_offload": "bool"},
    "hardware": {"gpu": "str", "gpus_per_node": "int", "nodes": "int", "intra_node_bw_gb_per_s": "num",
                 "inter_node_bw_gb_per_s": "num"},
    "model": {"layers": "int", "hidden": "int", "heads": "int", "kv_heads": "int", "ffn": "int", "vocab": "int",
              "head_dim": "int", "experts": "int", "tied_embeddings": "bool", "gated_mlp": "bool", "name": "str"},
}
CUSTOM_MODEL = {"name": "custom-3b", "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192,
                "vocab": 128256}
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2, 3, -1, 7, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(["nan", "", "1", "tp"]),
    st.lists(st.integers(0, 9), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _wrong_type(kind: str, v: object) -> bool:
    if kind == "int":
        return not isinstance(v, int) or isinstance(v, bool)
    if kind == "num":
        return not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
    if kind == "bool":
        return not isinstance(v, bool)
    return not isinstance(v, str)


MODEL_KEYS = {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "head_dim", "tied_embeddings",
              "gated_mlp", "experts", "experts_per_token", "expert_ffn", "qkv_bias", "mlp_bias", "norms_per_layer"}


def _must_fail(d: object) -> bool:
    """Whether the final document breaks the schema's types (so accepting it would be a silent fix-up)."""
    if not isinstance(d, dict) or set(d) - {"model", "hardware", "workload", "plan"}:
        return True
    for section, fields in FIELD_TYPES.items():
        if section not in d:
            continue
        v = d[section]
        if section == "model" and isinstance(v, str):
            continue
        if not isinstance(v, dict):
            return True
        extra = set(v) - set(fields) - (MODEL_KEYS if section == "model" else {"gpus"} if section == "hardware"
                                        else {"stage_layers"} if section == "plan" else set())
        if extra or any(_wrong_type(kind, v[k]) for k, kind in fields.items() if k in v):
            return True
    return False


@st.composite
def mutated(draw):
    """(file bytes, must_fail): a scenario with one to three mutations anywhere in the schema, or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64)), False
    d = json.loads(json.dumps(BASE))
    if draw(st.booleans()):
        d["model"] = dict(CUSTOM_MODEL)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "value", "value", "drop", "extra", "section", "top"]))
        section = draw(st.sampled_from(["workload", "plan", "hardware", "model"]))
        if kind == "top":
            d = draw(st.sampled_from([[], [d, 1], 3, "x", None, {}]))
            break
        if kind == "section":
            d[section] = draw(st.one_of(st.booleans(), st.integers(), st.just("nan"), st.just([]), st.just(10**18)))
            continue
        if not isinstance(d.get(section), dict):
            continue
        fields = FIELD_TYPES.get(section, {})
        if kind == "extra":
            d[section][draw(st.sampled_from(["bogus", "Tp", "gpus_total"]))] = 1
        elif kind == "drop" and d[section]:
            d[section].pop(draw(st.sampled_from(sorted(d[section]))))
        elif kind == "value" and fields:
            d[section][draw(st.sampled_from(sorted(fields)))] = draw(JUNK)
    return json.dumps(d, allow_nan=True).encode(), _must_fail(d)


def _check(r, must_fail: bool) -> None:
    assert r.exit_code in (0, 2), (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        # One line; predict over several scenarios first names each bad one on its own line.
        err = r.stderr.strip().splitlines()
        assert err and err[-1].startswith("error: "), r.stderr
        assert all(x.startswith(("line ", "index ")) for x in err[:-1]), r.stderr
    if must_fail:
        assert r.exit_code == 2, "a wrong-typed value was accepted (a silent fix-up)"


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _with(section: str, key: str, value) -> bytes:
    d = json.loads(json.dumps(BASE))
    d[section][key] = value
    return json.dumps(d).encode()


@SETTINGS
@given(case=mutated())
@example(case=(_with("hardware", "nodes", None), True))  # a CI draw: a null count read as "one node"
def test_predict_and_describe_never_break(tmp_path, case):
    data, must_fail = case
    f = tmp_path / "s.json"
    f.write_bytes(data)
    _check(runner.invoke(app, ["predict", str(f)]), must_fail)
    _check(runner.invoke(app, ["describe", str(f)]), must_fail)


NUM = st.one_of(st.integers(-3, 70000), st.sampled_from(["0", "-1", "1e18", "nan", "x", "", "999999999999"]))


@settings(max_examples=15, deadline=None)
@given(gpus=st.one_of(st.integers(-2, 64).map(str), st.sampled_from(["auto", "0", "x", "1.5"])),
       seq=st.integers(-5, 2**26), gb=st.integers(-2, 2**25), top=st.integers(-3, 50),
       obj=st.sampled_from(["dpo", "simpo", "rlhf", ""]), fw=st.sampled_from(["megatron", "trl", "bogus", "fsdp"]),
       target=st.floats(-5, 1e13, allow_nan=False), epochs=st.floats(-1, 1e5, allow_nan=False))
def test_rank_options_never_break(gpus, seq, gb, top, obj, fw, target, epochs):
    r = runner.invoke(app, ["rank", "--model", "llama-3.2-1b", "--gpu", "h100-sxm-80gb", "--gpus", gpus,
                            "--seq-len", str(seq), "--global-batch", str(gb), "--top", str(top), "--objective", obj,
                            "--framework", fw, "--target-pairs-per-s", repr(target), "--epochs", repr(epochs)])
    _check(r, must_fail=top < 1 or seq < 1 or gb < 1 or fw in ("trl", "bogus") or obj in ("rlhf", ""))


@settings(max_examples=25, deadline=None)
@given(gpus=st.integers(-2, 2**21), gpn=st.integers(-1, 2000), seq=st.integers(-1, 2**25), gb=st.integers(-1, 2**25),
       sample=st.integers(-2, 20), obj=st.sampled_from(["dpo", "pretrain", "x"]))
def test_plans_options_never_break(gpus, gpn, seq, gb, sample, obj):
    if gpus > 4096:  # big clusters are legal but slow to enumerate: keep the property test fast
        gpus = 4096 + gpus % 7
    r = runner.invoke(app, ["plans", "--model", "qwen2.5-0.5b", "--gpu", "a100-sxm-80gb", "--gpus", str(gpus),
                            "--gpus-per-node", str(gpn), "--seq-len", str(seq), "--global-batch", str(gb),
                            "--sample", str(sample), "--objective", obj])
    _check(r, must_fail=gpus < 1 or gpn < 1 or seq < 1 or gb < 1 or sample < 0 or obj == "x")


# --- JSON Lines: one answer per line --------------------------------------------------------------------------------


def test_json_lines_answers_every_line(tmp_path):
    good = json.dumps(BASE)
    bad_plan = json.dumps({**BASE, "plan": True})
    lines = [good, "{not json", bad_plan, "", good, json.dumps({**BASE, "workload": {"seq_len": True}})]
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["predict", str(f), "--json", "-"])
    assert r.exit_code == 2
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o.get("line") for o in out] == [1, 2, 3, 5, 6]  # the blank line 4 is no scenario
    assert "step_time_s" in out[0] and "step_time_s" in out[3]
    assert "not valid JSON" in out[1]["error"] and "plan must be an object" in out[2]["error"]
    assert "seq_len must be an integer" in out[4]["error"]
    assert "3 of 5 scenarios are invalid (line 2, line 3, line 6)" in r.stderr
    table = runner.invoke(app, ["predict", str(f)])
    assert table.exit_code == 2 and "invalid" in table.stdout and "line 3: scenario plan" in table.stderr


@pytest.mark.parametrize("content, fragment", [
    (b"\xff\xfe\x00garbage", "is not UTF-8"), (b"[]", "empty list"), (b"", "holds no scenario"),
    (b"[" * 100000, "nested too deeply"), (b'{"model": "llama-3.1-8b"}', "missing 'hardware'"),
    (b'{"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "nodes": 0}}', "nodes must be an integer in 1.."),
    (b'{"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb"}, "plan": "nan"}', "plan must be an object"),
    (b'{"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb"}, "workload": {"seq_len": 1e18}}',
     "seq_len must be an integer"),
])
def test_bad_files_are_one_line(tmp_path, content, fragment):
    f = tmp_path / "s.json"
    f.write_bytes(content)
    for cmd in ("predict", "describe"):
        r = runner.invoke(app, [cmd, str(f)])
        assert r.exit_code == 2, r.output
        assert fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- the library ----------------------------------------------------------------------------------------------------


def test_library_entry_points():
    with pytest.raises(PerfPredictError, match="predict takes one scenario"):
        perfpredict.predict([])
    assert perfpredict.predict_many([]) == []
    with pytest.raises(PerfPredictError, match="model must be a catalog name"):
        perfpredict.rank(model=123, cluster=Cluster(get_gpu("h100-sxm-80gb"), 8, 1), workload=Workload())
    with pytest.raises(PerfPredictError, match="cluster must be a Cluster"):
        perfpredict.rank(model="llama-3.2-1b", cluster="8xh100", workload=Workload())
    with pytest.raises(PerfPredictError, match="top must be an integer in 1.."):
        perfpredict.rank(model="llama-3.2-1b", cluster=Cluster(get_gpu("h100-sxm-80gb"), 8, 1), workload=Workload(),
                         top=-1)
    bad = {**BASE, "plan": {"cp": 2, "framework": "deepspeed"}}
    with pytest.raises(PerfPredictError, match=r"1 of 3 scenarios are invalid: \[1\] .*no context parallelism"):
        perfpredict.predict_many([BASE, bad, BASE])
    out = perfpredict.predict_many([BASE, bad, 7], errors="return")
    assert out[0].step_time_s > 0 and isinstance(out[1], PredictionError) and out[1].index == 1
    assert isinstance(out[2], PredictionError) and "must be a Scenario" in out[2].error


def test_cli_option_checks_come_before_the_work(tmp_path):
    base = ["rank", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8"]
    for extra, fragment in [(["--top", "-1"], "--top must be an integer in 1.."),
                            (["--target-pairs-per-s", "-3"], "--target-pairs-per-s must be a number in [0"),
                            (["--csv", "/nonexistent/dir/x.csv"], "--csv: directory '/nonexistent/dir' does not exist"),
                            (["--emit", "bogus"], "unknown --emit target 'bogus'"),
                            (["--emit", "fsdp", "--emit-dir", str(tmp_path / "f" / "x")], None),
                            (["--json", str(tmp_path)], "is a directory")]:
        if fragment is None:
            (tmp_path / "f").write_text("a file")
            fragment = "is a file"
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2 and fragment in r.stderr, (extra, r.output)
        assert "legal plans" not in r.stdout  # refused before the ranking printed anything
    f = tmp_path / "s.json"
    f.write_text(json.dumps(BASE))
    r = runner.invoke(app, ["predict", str(f), "--json", str(f)])
    assert r.exit_code == 2 and "is the input file" in r.stderr


def test_model_config_files_are_one_line(tmp_path):
    bad = tmp_path / "config.json"
    for content, fragment in [(b"\xff\xfe", "cannot read model config"), (b"[1]", "is not a JSON object"),
                              (b'{"hidden_size": "x", "num_attention_heads": 8, "num_hidden_layers": 2, '
                               b'"vocab_size": 10}', "lacks a required field"),
                              (b'{"hidden_size": 64, "num_attention_heads": 0, "num_hidden_layers": 2, '
                               b'"vocab_size": 10}', "model config")]:
        bad.write_bytes(content)
        r = runner.invoke(app, ["plans", "--model", str(bad), "--gpu", "h100-sxm-80gb"])
        assert r.exit_code == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


# --- what a newcomer types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--plot", "--json", "--csv", "--emit-dir"])
def test_a_file_where_a_folder_must_be_is_named(tmp_path, option):
    from perfpredict.core.paths import writable_dir, writable_file

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for target in (afile / "x.png", afile / "sub" / "x.png"):
        check = writable_dir if option == "--emit-dir" else writable_file
        with pytest.raises(PerfPredictError, match=f"{option}: '{afile}' is a file, not a folder"):
            check(option, target)
    with pytest.raises(PerfPredictError, match="is a file, not a folder"):
        writable_dir("--emit-dir", afile)


def test_rank_takes_a_hugging_face_id_and_refuses_a_partial_node():
    base = ["rank", "--gpu", "h100-sxm-80gb", "--top", "1"]
    r = runner.invoke(app, [*base, "--model", "meta-llama/Llama-3.1-8B", "--gpus", "12"])
    assert r.exit_code == 2 and "--gpus 12 is not a whole number of 8-GPU nodes: use 8 or 16" in r.stderr, r.output
    r = runner.invoke(app, [*base, "--model", "nobody/Nothing-1B", "--gpus", "8"])
    assert r.exit_code == 2 and "not in the catalog" in r.stderr and "config.json" in r.stderr, r.output


def test_rank_report_notes_a_prime_gpu_count():
    from perfpredict.api import rank_report

    rep = rank_report(model="llama-3.2-1b", gpu="h100-sxm-80gb", gpus=5)
    assert any(n.startswith("5 GPUs is prime") and "4 GPUs would have" in n for n in rep.notes), rep.notes
