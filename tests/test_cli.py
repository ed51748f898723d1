"""The command line as a newcomer meets it: every option a command accepts is honoured or refused, output paths
mean the same everywhere (`-` is stdout), and what was ranked is what is emitted."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from perfpredict.cli import app

runner = CliRunner()
GEN = ["generate", "rank", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--prompts", "2000"]
TRAIN = ["rank", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8"]


def test_predict_generation_json_file_is_written(tmp_path):
    out = tmp_path / "out.json"
    r = runner.invoke(app, ["predict", "examples/scenario-generate-70b.json", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output == ""  # nothing on stdout: the answer went to the file
    row = json.loads(out.read_text().splitlines()[0])
    assert row["fits"] and row["output_tokens_per_s"] > 0


def test_emit_vllm_writes_the_settings_it_ranked_with(tmp_path):
    r = runner.invoke(app, [*GEN, "--gpu-memory-utilization", "0.8", "--emit", "vllm", "--emit-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    spec = json.loads((tmp_path / "vllm_layout.json").read_text())
    assert spec["llm_args"]["gpu_memory_utilization"] == 0.8
    assert "--gpu-memory-utilization 0.8" in (tmp_path / "launch_replicas.sh").read_text()


def test_emit_vllm_on_cpu_writes_the_kv_space_ranked(tmp_path):
    r = runner.invoke(app, ["generate", "rank", "--model", "llama-3.2-1b", "--gpu", "cpu", "--gpus", "2",
                            "--gpus-per-node", "2", "--prompts", "64", "--kv-space-gib", "6", "--emit", "vllm",
                            "--emit-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "VLLM_CPU_KVCACHE_SPACE=6 " in (tmp_path / "launch_replicas.sh").read_text()


def test_generate_rank_refuses_what_it_cannot_use():
    r = runner.invoke(app, [*GEN, "--intra-node-bw", "100"])
    assert r.exit_code == 2 and "--intra-node-bw" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, [*GEN, "--kv-space-gib", "4"])
    assert r.exit_code == 2 and "CPU hosts" in r.output


def test_generate_rank_honours_predictor(tmp_path):
    import shutil
    from pathlib import Path

    import perfpredict

    r = runner.invoke(app, [*GEN, "--predictor", str(tmp_path)])
    assert r.exit_code == 2 and "no generation model there" in r.output
    shipped = Path(perfpredict.__file__).parent / "predictor" / "default"
    shutil.copytree(shipped / "generate", tmp_path / "generate")
    r = runner.invoke(app, [*GEN, "--predictor", str(tmp_path), "--json", "-"])
    assert r.exit_code == 0, r.output
    assert r.output == runner.invoke(app, [*GEN, "--json", "-"]).output


def test_emit_target_checked_before_ranking():
    t0 = time.perf_counter()
    r = runner.invoke(app, [*TRAIN, "--emit", "trl"])
    assert r.exit_code == 2 and "--framework trl" in r.output
    assert "legal plans" not in r.output  # refused before any ranking was printed
    assert time.perf_counter() - t0 < 30
    r = runner.invoke(app, [*TRAIN, "--emit", "vllm"])
    assert r.exit_code == 2 and "generate rank" in r.output


def test_json_dash_honours_top():
    r = runner.invoke(app, [*TRAIN, "--top", "3", "--json", "-"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [x["rank"] for x in rows] == [1, 2, 3]


def test_tables_group_thousands():
    r = runner.invoke(app, [*GEN, "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "e+0" not in r.output and "2,000 prompts" in r.output


def test_repeated_rejections_are_merged():
    r = runner.invoke(app, ["generate", "rank", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--prompts",
                            "2000"])
    assert r.exit_code == 0, r.output
    head = r.output.split("\n")[1]
    assert head.count("TP1 x8:") == 1 and "(3)" in head


@pytest.mark.parametrize("cmd", [["rank"], ["generate", "rank"], ["iteration"], ["evaluate"], ["plans"]])
def test_help_option_names_are_whole(cmd):
    r = runner.invoke(app, [*cmd, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
