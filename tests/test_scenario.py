import json

import pytest

from perfpredict.core import Cluster, ModelSpec, PerfPredictError, Plan, Scenario, Workload, get_gpu, get_model
from perfpredict.core.hf_config import model_from_hf_config
from perfpredict.core.scenario import load_scenarios


def test_scenario_round_trips_through_json():
    s = Scenario(model=get_model("llama-3.1-8b"), cluster=Cluster(get_gpu("h100-sxm-80gb"), 8, 2),
                 workload=Workload(objective="dpo", seq_len=2048, global_batch=64),
                 plan=Plan(tp=2, dp=8, zero=1, micro_batch=2, grad_accum=4, sequence_parallel=True))
    back = Scenario.from_dict(json.loads(s.to_json()))
    assert back == s


def test_issue_example_scenario_parses(tmp_path):
    text = open("examples/scenario-8b-pretrain.json").read()
    (s,) = [Scenario.from_dict(d) for d in load_scenarios_text(tmp_path, text)]
    assert s.plan.gpus == 16 and s.model.param_count == get_model("llama-3.1-8b").param_count


def load_scenarios_text(tmp_path, text):
    p = tmp_path / "s.json"
    p.write_text(text)
    return load_scenarios(p)


def test_json_lines(tmp_path):
    one = json.loads(open("examples/scenario-8b-dpo.json").read())
    p = tmp_path / "many.jsonl"
    p.write_text("\n".join(json.dumps(one) for _ in range(3)))
    assert len(load_scenarios(p)) == 3


@pytest.mark.parametrize("bad, fragment", [
    ({"objective": "rlhf"}, "accepted: pretrain, sft, dpo"),
    ({"seq_len": -5}, "seq_len must be an integer in 1..16777216"),
    ({"global_batch": 0}, "global_batch must be an integer in 1..16777216"),
    ({"seq_len": True}, "seq_len must be an integer"),
    ({"seq_len": 10**18}, "seq_len must be an integer in 1..16777216, got 1000000000000000000"),
    ({"epochs": "two"}, "epochs must be a number in (0, 10000]"),
    ({"epochs": float("nan")}, "epochs must be a number"),
    ({"master_weights_fp32": "yes"}, "master_weights_fp32 must be true or false"),
    ({"precision": ["bf16"]}, "unknown precision"),
    ({"objective": "simpo", "reference": "live"}, "has no reference model"),
    ({"objective": "dpo", "reference": "none"}, "needs a reference model"),
])
def test_workload_rejects(bad, fragment):
    with pytest.raises(PerfPredictError) as e:
        Workload(**bad)
    assert fragment in str(e.value)


def test_reference_defaults():
    assert Workload(objective="dpo").reference == "live"
    assert Workload(objective="orpo").reference == "none"
    assert Workload(objective="ipo").needs_reference and not Workload(objective="simpo").needs_reference


@pytest.mark.parametrize("bad, fragment", [
    ({"tp": 0}, "tp must be an integer in 1.."),
    ({"tp": True}, "tp must be an integer in 1.."),
    ({"zero": True}, "zero must be 0, 1, 2 or 3"),
    ({"ep": 2**40}, "ep must be an integer in 1.."),
    ({"optimizer_offload": 1}, "optimizer_offload must be true or false"),
    ({"stage_layers": [4, "x"]}, "stage_layers must be a list of positive integers"),
    ({"framework": "harness"}, "not modelled"),
    ({"zero": 4}, "zero must be 0, 1, 2 or 3"),
    ({"recompute": "some"}, "accepted: none, selective, full"),
    ({"framework": "jax"}, "accepted: megatron"),
])
def test_plan_rejects(bad, fragment):
    with pytest.raises(PerfPredictError, match=fragment):
        Plan(**bad)


def test_model_rejects_heads_not_multiple_of_kv():
    with pytest.raises(PerfPredictError, match="multiple of kv_heads"):
        ModelSpec(name="x", layers=2, hidden=64, heads=6, kv_heads=4, ffn=128, vocab=100)


def test_scenario_gpu_count_mismatch():
    with pytest.raises(PerfPredictError, match="cluster has 16"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "nodes": 2},
                            "plan": {"tp": 2, "dp": 2}})


def test_unknown_scenario_key():
    with pytest.raises(PerfPredictError, match="accepted: model, hardware, workload, plan"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb"}, "cluster": {}})


def test_malformed_json_lines(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"model": "llama-3.1-8b"}\n{oops\n')
    with pytest.raises(PerfPredictError, match="line 2 is not valid JSON"):
        load_scenarios(p)


HF_CONFIGS = {
    # Published config.json field values (meta-llama/Llama-3.1-8B, mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen2.5-7B,
    # google/gemma-2-2b, microsoft/Phi-3-mini-4k-instruct, ibm-granite/granite-3.1-8b-base); totals from model cards.
    "llama": ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
               "tie_word_embeddings": False}, 8.03e9),
    "mixtral": ({"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "tie_word_embeddings": False}, 46.7e9),
    "qwen2": ({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
               "num_hidden_layers": 28, "intermediate_size": 18944, "vocab_size": 152064,
               "tie_word_embeddings": False}, 7.62e9),
    "gemma2": ({"model_type": "gemma2", "hidden_size": 2304, "num_attention_heads": 8, "num_key_value_heads": 4,
                "head_dim": 256, "num_hidden_layers": 26, "intermediate_size": 9216, "vocab_size": 256000}, 2.61e9),
    "phi3": ({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_key_value_heads": 32,
              "num_hidden_layers": 32, "intermediate_size": 8192, "vocab_size": 32064,
              "tie_word_embeddings": False}, 3.82e9),
    "granite": ({"model_type": "granite", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "num_hidden_layers": 40, "intermediate_size": 12800, "vocab_size": 49155,
                 "tie_word_embeddings": True}, 8.17e9),
}


@pytest.mark.parametrize("kind", sorted(HF_CONFIGS))
def test_hf_config_reader(tmp_path, kind):
    cfg, published = HF_CONFIGS[kind]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(p)
    assert m.param_count == pytest.approx(published, rel=0.01)  # 1%: the model cards round to 3 digits
    assert get_model(str(p)) == m


def test_hf_config_unsupported(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(PerfPredictError, match="not supported; accepted: llama"):
        model_from_hf_config(p)


def test_hf_config_missing_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(PerfPredictError, match="lacks a required field"):
        model_from_hf_config(p)


def test_cluster_bandwidth_override():
    c = Cluster(get_gpu("h100-sxm-80gb"), 8, 2, inter_node_bw_gb_per_s=12.5)
    assert c.inter_node_bw_gb_per_s == 12.5 and c.intra_node_bw_gb_per_s == get_gpu("h100-sxm-80gb").intra_node_bw_gb_per_s


def test_sequence_parallel_with_tp1_is_off_as_megatron_does():
    # Megatron-LM's arguments.py: "Disabling sequence parallelism because tensor model parallelism is disabled".
    assert Plan(sequence_parallel=True).sequence_parallel is False
    assert Plan(tp=2, sequence_parallel=True).sequence_parallel is True


# --- a pretty-printed file is one document ------------------------------------------------------------------------


@pytest.mark.parametrize("edit, where", [
    (lambda t: t.rstrip() + ",\n", "text after the end of the JSON value at line 5, column 37"),
    (lambda t: t.replace('"deepspeed"}}', '"deepspeed",}}'), "at line 5, column 36"),
])
def test_broken_pretty_printed_file_is_one_json_error(tmp_path, edit, where):
    """One multi-line object with a trailing comma is one broken document, not five broken JSON Lines."""
    from perfpredict.api import describe_scenarios
    from perfpredict.core.scenario import read_scenarios

    p = tmp_path / "s.json"
    p.write_text(edit(open("examples/scenario-8b-dpo.json").read()))
    for read in (load_scenarios, read_scenarios, lambda f: describe_scenarios(path=f)):
        with pytest.raises(PerfPredictError, match="is not valid JSON: ") as e:
            read(p)
        assert where in str(e.value) and "scenarios are invalid" not in str(e.value)


def test_json_lists_and_lines_still_answer_each_entry(tmp_path):
    from perfpredict.core.scenario import read_scenarios

    one = json.loads(open("examples/scenario-8b-dpo.json").read())
    p = tmp_path / "list.json"
    p.write_text(json.dumps([one, {**one, "plan": 3}], indent=2))
    items = read_scenarios(p)
    assert [(it.where, it.at, it.error is None) for it in items] == [("index", 0, True), ("index", 1, False)]
    p.write_text(json.dumps(one) + "\n{oops\n" + json.dumps(one) + "\n")
    items = read_scenarios(p)
    assert [(it.at, it.error is None) for it in items] == [(1, True), (2, False), (3, True)]
    p.write_text(open("examples/scenario-8b-dpo.json").read())  # valid and pretty-printed: one scenario
    assert len(read_scenarios(p)) == 1


def test_scenario_model_may_be_a_hugging_face_id():
    d = json.loads(open("examples/scenario-8b-dpo.json").read())
    by_id = Scenario.from_dict({**d, "model": "meta-llama/Llama-3.1-8B"})
    assert by_id == Scenario.from_dict(d)


# --- one GPU-count rule ------------------------------------------------------------------------------------------


def test_gpu_counts_are_one_partial_node_or_whole_nodes():
    from perfpredict.api import make_cluster
    from perfpredict.core.hardware import node_shape

    assert node_shape(7, 8) == (7, 1) and node_shape(8, 8) == (8, 1) and node_shape(24, 8) == (8, 3)
    with pytest.raises(PerfPredictError, match="gpus 12 is not a whole number of 8-GPU nodes: use 8 or 16, or set "
                                               "gpus_per_node"):
        node_shape(12, 8)
    with pytest.raises(PerfPredictError, match="--gpus 12 is not a whole number of 8-GPU nodes: use 8 or 16, or "
                                               "set --gpus-per-node"):
        make_cluster(gpu="h100-sxm-80gb", gpus=12)
    assert make_cluster(gpu="h100-sxm-80gb", gpus=12, gpus_per_node=4).nodes == 3
    with pytest.raises(PerfPredictError, match="gpus 20 is not a whole number of 8-GPU nodes: use 16 or 24"):
        Cluster.from_dict({"gpu": "h100-sxm-80gb", "gpus": 20})
    c = Cluster.from_dict({"gpu": "h100-sxm-80gb", "gpus": 7})
    assert (c.gpus_per_node, c.nodes) == (7, 1)


def test_a_prime_gpu_count_says_why_it_ranks_few_plans():
    from perfpredict.api import gpu_count_note, make_cluster
    from perfpredict.features.plans import PlanSpace

    m, w = get_model("llama-3.1-8b"), Workload(objective="dpo", global_batch=64)
    note = gpu_count_note(model=m, cluster=make_cluster(gpu="h100-sxm-80gb", gpus=7), workload=w, space=PlanSpace(),
                          gpus_per_node=8)
    assert note.startswith("7 GPUs is prime: every plan must use a degree of 7 in tp, pp, cp or dp (")
    assert "8 GPUs would have" in note
    assert gpu_count_note(model=m, cluster=make_cluster(gpu="h100-sxm-80gb", gpus=6), workload=w, space=PlanSpace(),
                          gpus_per_node=8) is None
