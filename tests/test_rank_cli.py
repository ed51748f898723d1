"""`perfpredict rank` and `perfpredict predict` through typer's CliRunner, on the shipped default predictor."""

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from perfpredict.cli import app

runner = CliRunner()
BASE = ["rank", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "16", "--gpus-per-node", "8",
        "--objective", "dpo", "--pairs", "60000", "--seq-len", "2048", "--global-batch", "64"]


def test_rank_table_and_explain():
    r = runner.invoke(app, BASE + ["--top", "5", "--explain", "--target-pairs-per-s", "1"])
    assert r.exit_code == 0, r.output
    assert "legal plans" in r.output and "predicted to fit" in r.output
    assert "top 5 plans" in r.output and "pairs/s" in r.output
    assert "#1 is" in r.output and "meets it" in r.output


def test_rank_json_stdout_is_the_ranking_to_top():
    r = runner.invoke(app, BASE + ["--json", "-", "--top", "200"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 200
    fits = [x for x in rows if x["fits"]]
    assert fits[0]["rank"] == 1
    # ordered by the expected throughput over the pipeline-stall regimes (models.stall; the throughput itself
    # where no pipeline may stall)
    assert fits[0]["expected_samples_per_s"] >= max(x["expected_samples_per_s"] for x in fits)
    assert all(x["stall_risk"] > 0 or x["expected_samples_per_s"] == x["samples_per_s"] for x in rows)
    for k in ("plan", "samples_per_s", "tokens_per_s", "peak_memory_gib", "mfu", "dominant", "time_to_finish_h"):
        assert k in rows[0]
    # No fitting plan's peak exceeds what its stated margin allows; every verdict comes with its risk.
    for x in rows:
        assert x["fits"] == (x["fit_verdict"] == "fits") and 0.0 <= x["oom_risk"] <= 1.0
        assert not x["fits"] or x["peak_memory_gib"] * (1 + x["oom_margin"]) <= x["r_usable_gib"] + 1e-9
        assert not x["fits"] or x["oom_risk"] <= 0.05


def test_rank_csv_file(tmp_path):
    p = tmp_path / "r.csv"
    r = runner.invoke(app, BASE + ["--csv", str(p)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(p.read_text())))
    assert len(rows) > 100 and float(rows[0]["samples_per_s"]) > 0


def test_rank_plot(tmp_path):
    p = tmp_path / "pareto.png"
    r = runner.invoke(app, BASE + ["--plot", str(p)])
    assert r.exit_code == 0, r.output
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000


def test_rank_gpus_auto_finds_a_cluster():
    r = runner.invoke(app, ["rank", "--model", "llama-3.2-1b", "--gpu", "a100-sxm-80gb", "--gpus", "auto",
                            "--objective", "sft", "--global-batch", "64", "--seq-len", "1024",
                            "--target-pairs-per-s", "20", "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "fewest GPUs meeting" in r.output


def test_rank_gpus_auto_without_a_target_answers_the_fewest_that_fit():
    r = runner.invoke(app, ["rank", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", "auto",
                            "--framework", "megatron", "--global-batch", "64", "--top", "1"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "fewest GPUs with a plan that fits" in x)
    gpus = int(line.split("fits: ")[1].split(" ")[0])
    assert gpus > 1 and "headroom" in r.output
    # One size smaller has no fitting plan: the answer is the fewest.
    smaller = runner.invoke(app, ["rank", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", str(gpus // 2),
                                  "--framework", "megatron", "--global-batch", "64", "--top", "1"])
    assert smaller.exit_code == 0 and "0 predicted to fit" in smaller.output, smaller.output


def test_rank_gpus_auto_unreachable_target_says_the_best_found():
    r = runner.invoke(app, ["rank", "--model", "llama-3.2-1b", "--gpu", "a100-sxm-80gb", "--gpus", "auto",
                            "--objective", "sft", "--global-batch", "64", "--seq-len", "1024",
                            "--target-pairs-per-s", "1e9", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "NOT reached: the best found is" in r.output and "out of reach" in r.output


def test_offload_plans_show_and_check_host_ram(tmp_path):
    """Issue 21: 70B DPO on 4 RTX 4090 was recommended ZeRO-3 parameter + optimizer offload needing ~1.2 TB of host
    RAM. On the catalog's 256 GiB GeForce node it is refused, saying why; on a 2 TiB node it is a legal plan again
    and carries what it needs."""
    args = ["rank", "--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--gpus", "4", "--framework", "deepspeed",
            "--reference", "precomputed", "--top", "3"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "offload plan(s) refused" in r.output and "the node has 256 GiB" in r.output
    table = tmp_path / "all.csv"
    big = runner.invoke(app, args + ["--host-ram-gib", "2048", "--csv", str(table)])
    assert big.exit_code == 0, big.output
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    both = [x for x in rows if x["p_param_offload"] == "true"]
    assert both and all(1000 < float(x["host_ram_gib"]) <= 2048 for x in both)
    assert all(float(x["host_ram_gib"]) == 0.0 for x in rows if x["p_offload"] == "false")


def test_rank_shows_headroom_and_host_ram():
    """8B DPO on one RTX 4090 fits only with ZeRO-3 offload (about 150 GiB of host RAM): the table shows it beside
    the GPU headroom; a 64 GiB node refuses those plans."""
    args = ["rank", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", "1", "--framework", "deepspeed",
            "--reference", "precomputed", "--top", "3"]
    r = runner.invoke(app, args + ["--json", "-"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert all(x["headroom_gib"] == pytest.approx(24.0 - x["peak_memory_gib"]) for x in rows)
    assert any(x["fits"] and 100 < x["host_ram_gib"] < 256 for x in rows)
    table = runner.invoke(app, args)
    assert "headroom" in table.output and "host GiB" in table.output
    small = runner.invoke(app, args + ["--host-ram-gib", "64"])
    assert small.exit_code == 0 and "the node has 64 GiB" in small.output, small.output


def test_nothing_fits_says_what_would():
    # 8B DPO on one 40 GiB A100: the best single-GPU plan (ZeRO-3 with offload) is at risk; 8 GPUs or a
    # precomputed reference fit.
    r = runner.invoke(app, ["rank", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-40gb", "--gpus", "1",
                            "--gpus-per-node", "8", "--global-batch", "8", "--seq-len", "4096"])
    assert r.exit_code == 0, r.output
    assert "0 predicted to fit" in r.output and "What would" in r.output
    assert "Traceback" not in r.output
    # When no single change helps either, it says so instead of an empty "What would:".
    r = runner.invoke(app, ["rank", "--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--gpus", "2",
                            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32768"])
    assert r.exit_code == 0 and "no single change tried makes a plan fit" in r.output, r.output


@pytest.mark.parametrize("args, fragment", [
    (["--gpu", "h100"], "close names"),
    (["--model", "llama-99b"], "unknown model"),
    (["--gpus", "-3"], "--gpus must be a positive integer or 'auto'"),
    (["--host-ram-gib", "-1"], "--host-ram-gib"),
    (["--json", "-", "--csv", "-"], "both write to stdout"),
    (["--objective", "simpo", "--reference", "live"], "has no reference model"),
    (["--global-batch", "0"], "global_batch must be an integer in 1..16777216"),
    (["--emit", "cuda"], "accepted"),
    (["--seq-len-cv", "-0.1"], "seq_len_cv must be a number in [0, 2]"),
])
def test_rank_bad_input_is_one_line(args, fragment):
    base = dict(zip(BASE[1::2], BASE[2::2], strict=False))
    argv = ["rank"]
    overrides = dict(zip(args[0::2], args[1::2], strict=False))
    for k, v in {**base, **overrides}.items():
        argv += [k, v]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert fragment in r.output, r.output


def test_predict_file_json_lines(tmp_path):
    one = json.loads(open("examples/scenario-8b-pretrain.json").read())
    two = json.loads(open("examples/scenario-8b-dpo.json").read())
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(one) + "\n" + json.dumps(two) + "\n")
    r = runner.invoke(app, ["predict", str(p), "--json", "-"])
    assert r.exit_code == 0, r.output
    out = [json.loads(line) for line in r.output.splitlines()]
    assert len(out) == 2
    for o in out:
        assert {"step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_gib", "fits"} <= set(o)
        assert o["step_time_interval_s"][0] <= o["step_time_s"] <= o["step_time_interval_s"][1]
    # Same order as the file: the DPO scenario moves 2 sequences per pair.
    assert out[1]["tokens_per_s"] == pytest.approx(out[1]["samples_per_s"] * 2 * 2048)


def test_predict_table():
    r = runner.invoke(app, ["predict", "examples/scenario-8b-dpo.json"])
    assert r.exit_code == 0, r.output
    assert "samples/s" in r.output


def test_predict_explain_shows_margin_and_three_way_verdict():
    """predict --explain says how the fits verdict was reached, as rank --explain does (predictor.predict.fit_line)."""
    r = runner.invoke(app, ["predict", "examples/scenario-8b-dpo.json", "--explain"], terminal_width=400)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "Fit: " in x)
    assert "margin" in line and "usable" in line and "at risk" in line and "does not fit" in line
    r = runner.invoke(app, ["predict", "examples/scenario-8b-dpo.json", "--explain", "--json", "-"])
    assert r.exit_code == 0 and "margin" in json.loads(r.output.splitlines()[0])["fit_explanation"]
    r = runner.invoke(app, ["predict", "examples/scenario-generate-70b.json", "--explain"])
    assert r.exit_code == 2 and "training scenario" in r.output and "Traceback" not in r.output


def test_library_rank_keyword_only():
    import perfpredict
    from perfpredict.core import Cluster, Workload, get_gpu

    df = perfpredict.rank(model="qwen2.5-0.5b", cluster=Cluster(get_gpu("a100-sxm-80gb"), 8, 1),
                          workload=Workload(objective="orpo", seq_len=1024, global_batch=32), top=5)
    assert df.height == 5 and df["samples_per_s"].is_sorted(descending=True)
    with pytest.raises(TypeError):
        perfpredict.rank("qwen2.5-0.5b")  # keyword-only


@pytest.mark.parametrize("target, framework", [("deepspeed", "deepspeed"), ("fsdp", "fsdp"),
                                               ("megatron", "megatron"), ("torchrun", "megatron"),
                                               ("torchrun", "deepspeed")])
def test_emit_targets_parse_back(tmp_path, target, framework):
    import shlex

    import yaml

    out = tmp_path / "plan"
    r = runner.invoke(app, BASE + ["--framework", framework, "--emit", target, "--emit-dir", str(out),
                                   "--json", str(tmp_path / "r.json"), "--top", "100000"])
    assert r.exit_code == 0, r.output
    import re

    rank_no = int(re.search(r"emitting plan #(\d+)", r.output).group(1))
    best = [x for x in json.loads((tmp_path / "r.json").read_text()) if x["rank"] == rank_no][0]
    files = {p.name: p.read_text() for p in out.iterdir()}
    assert files, r.output
    for name, text in files.items():
        if name.endswith(".json"):
            d = json.loads(text)
            if "train_micro_batch_size_per_gpu" in d:
                assert d["train_micro_batch_size_per_gpu"] * d["gradient_accumulation_steps"] * best["p_dp"] == 64
                assert d["zero_optimization"]["stage"] == best["p_zero"]
            if "per_device_train_batch_size" in d:
                assert d["per_device_train_batch_size"] == best["p_micro_batch"]
        elif name.endswith(".yaml"):
            d = yaml.safe_load(text)
            assert d["num_processes"] == 16 and d["num_machines"] == 2
        elif name == "nemo_aligner_overrides.txt":  # the DPO trainer on Megatron (NeMo-Aligner)
            assert f"++model.tensor_model_parallel_size={best['p_tp']}" in text
        elif name.endswith(".txt"):
            toks = shlex.split("\n".join(line for line in text.splitlines() if not line.startswith("#")))
            assert toks[toks.index("--tensor-model-parallel-size") + 1] == str(best["p_tp"])
            assert toks[toks.index("--pipeline-model-parallel-size") + 1] == str(best["p_pp"])
        elif name.endswith(".sh"):
            assert "--nnodes" in text or "--num_machines" in text


def test_inter_node_bandwidth_changes_a_two_node_dpo_ranking():
    """The TP-or-DP question depends on the cluster's links. On 2 nodes, a plan whose data-parallel
    gradients cross nodes pays for a 4x slower inter-node link; plans that keep that traffic inside a node do not,
    so the order changes, and --explain shows the DP communication behind it."""
    def ranking(bw: str) -> list[dict]:
        r = runner.invoke(app, BASE + ["--inter-node-bw", bw, "--json", "-"])
        assert r.exit_code == 0, r.output
        return [x for x in json.loads(r.output) if x["fits"]]

    slow, fast = ranking("12.5"), ranking("50")
    assert [x["plan"] for x in slow[:10]] != [x["plan"] for x in fast[:10]]
    by_plan = {x["plan"]: x for x in fast}
    crossing = [x for x in slow if x["p_dp"] * x["p_tp"] * x["p_pp"] > 8 and x["p_dp"] > 1 and x["plan"] in by_plan]
    assert crossing
    for x in crossing:  # more bandwidth is never slower, and DP traffic that crosses nodes gets cheaper
        assert by_plan[x["plan"]]["step_time_s"] <= x["step_time_s"] * (1 + 1e-9)
        assert by_plan[x["plan"]]["b_dp_comm_s"] <= x["b_dp_comm_s"] * (1 + 1e-9)
    r = runner.invoke(app, BASE + ["--inter-node-bw", "12.5", "--top", "3", "--explain"])
    assert r.exit_code == 0 and "DP communication" in r.output, r.output
