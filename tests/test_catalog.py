"""Every GPU and model catalog entry: loads, is sourced, and agrees with its published figures.

Model shapes come from each model's Hugging Face config.json; ``published_params`` is the published total (the Hugging
Face safetensors metadata total where one exists, else the model card), and each entry's ``source`` field names both.
The tests run over whatever the catalog holds, so a new entry is checked as soon as its JSON file lands.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from perfpredict.core.catalog import get_gpu, get_model, gpu_catalog, model_catalog, model_catalog_raw
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import GPUSpec
from perfpredict.core.model import ModelSpec

GPU_NAMES = sorted(gpu_catalog())
MODEL_NAMES = sorted(model_catalog_raw())
MOE_WITH_ACTIVE = sorted(n for n, d in model_catalog_raw().items() if d.get("experts") and "active_params" in d)


def _files(kind: str) -> dict[str, dict]:
    root = resources.files("perfpredict") / "catalog" / kind
    return {e.name: json.loads(e.read_text()) for e in root.iterdir() if e.name.endswith(".json")}


def test_catalogs_are_populated():
    assert len(GPU_NAMES) >= 17
    assert len(MODEL_NAMES) >= 25
    assert "cpu" in GPU_NAMES  # the entry for our own CPU measurements


@pytest.mark.parametrize("kind", ["gpus", "models"])
def test_file_name_is_entry_name(kind):
    """One file per entry, named after its "name" field, and no two files claim the same name."""
    files = _files(kind)
    assert {f"{d['name']}.json" for d in files.values()} == set(files)
    for fname, d in files.items():
        assert fname == f"{d['name']}.json"
        assert d["name"] == d["name"].strip().lower(), "lookups lower-case the key, so names must be lower case"


# --- models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_entry_is_sourced(name):
    raw = model_catalog_raw()[name]
    for key in ("family", "hf_id", "source"):
        assert isinstance(raw.get(key), str) and raw[key].strip(), f"{name}: missing {key}"
    assert "config.json" in raw["source"], f"{name}: the source must name the config.json the shape comes from"
    assert isinstance(raw.get("published_params"), int) and raw["published_params"] > 0, name
    assert isinstance(model_catalog()[name], ModelSpec)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_param_count_matches_published(name):
    """ModelSpec.param_count is within 1% of the published total recorded in the entry.

    The published totals are those cited in each entry's "source": the Hugging Face safetensors totals (e.g.
    meta-llama/Llama-3.1-8B 8,030,261,248; Qwen/Qwen2.5-7B 7,615,616,512 = index total_size 15,231,233,024 bytes / 2;
    google/gemma-2-9b 9,241,705,984; mistralai/Mixtral-8x7B-v0.1 46,702,792,704). For llama-moe-3.5b the total is
    derived from LLaMA-2-7B plus its gate networks, as the entry's notes explain.
    """
    raw = model_catalog_raw()[name]
    spec = ModelSpec.from_dict(raw, name=name)
    published = raw["published_params"]
    err = abs(spec.param_count - published) / published
    assert err <= 0.01, (f"{name}: param_count {spec.param_count:,} vs published {published:,} ({err:.2%}); "
                         f"source: {raw['source']}")


@pytest.mark.parametrize("name", MOE_WITH_ACTIVE)
def test_moe_active_params_match_published(name):
    """Active (per-token) parameters within 2% of the published figure: Mixtral 12.9B (Mistral AI announcement),
    LLaMA-MoE-3.5B (4/16) 3.5B (pjlab-sys4nlp/llama-moe README)."""
    raw = model_catalog_raw()[name]
    spec = model_catalog()[name]
    assert spec.is_moe
    published = raw["active_params"]
    err = abs(spec.active_param_count - published) / published
    assert err <= 0.02, f"{name}: active {spec.active_param_count:,} vs published {published:,} ({err:.2%})"
    assert spec.active_param_count < spec.param_count


def test_moe_entries_publish_active_params():
    moe = sorted(n for n, d in model_catalog_raw().items() if d.get("experts"))
    assert moe, "expected at least one MoE entry"
    assert moe == MOE_WITH_ACTIVE


# --- GPUs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_entry_loads_and_is_sourced(name):
    gpu = get_gpu(name)
    assert gpu.name == name
    assert gpu.vendor in {"nvidia", "amd", "cpu"}
    assert gpu.sources and all(isinstance(s, str) and len(s) > 20 for s in gpu.sources), f"{name}: needs sources"
    assert gpu.notes.strip(), f"{name}: needs notes (assumptions behind the bandwidth figures)"


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_figures_are_sane(name):
    """Dense peak rates, binary-sized memory, per-direction bandwidths."""
    gpu = get_gpu(name)
    # Dense figures: even B200's dense BF16 (2,250) stays below 2,500, while its sparse figure (4,500) would not.
    # GB200/GB300 run 2,500 dense BF16 TFLOPS; the sparse figure of any Blackwell part is 4,500 or more.
    assert 0 < gpu.bf16_tflops <= 2500, f"{name}: bf16 {gpu.bf16_tflops} looks like a sparsity figure"
    assert 0 < gpu.fp16_tflops <= 2500
    # FP8 runs at twice the 16-bit rate where it exists (datasheet rounding allowed).
    assert gpu.fp8_tflops == 0 or gpu.fp8_tflops == pytest.approx(2 * gpu.bf16_tflops, rel=0.015)
    assert 0 < gpu.fp32_tflops <= gpu.bf16_tflops, f"{name}: tensor bf16 should beat plain fp32"
    assert 1 <= gpu.memory_gib <= 512
    assert 0 < gpu.hbm_tb_per_s < 20
    assert 0 < gpu.inter_node_bw_gb_per_s <= gpu.intra_node_bw_gb_per_s <= 1000
    assert 0 <= gpu.pcie_gb_per_s <= 128
    assert gpu.sms >= 0 and gpu.l2_mib >= 0


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_clock_and_fabric_are_stated_and_cited(name):
    """Every GPU entry states its boost clock (the kernel models count fixed costs in cycles) and how its GPUs reach
    each other (NCCL's per-hop latency differs by link kind), and a source with a URL states the clock; CPU hosts
    state "none" and no clock."""
    gpu = get_gpu(name)
    if gpu.is_cpu:
        assert gpu.intra_node_fabric == "none" and gpu.boost_clock_mhz == 0 and gpu.nvlink_generation == 0
        return
    # 1,000-3,000 MHz: every datacenter/consumer part since Volta (V100 1,530, RTX PRO 6000 2,617).
    assert 1000 <= gpu.boost_clock_mhz <= 3000, f"{name}: boost clock {gpu.boost_clock_mhz} MHz"
    clock = f"{gpu.boost_clock_mhz:,.0f}".replace(",", "")
    assert any("http" in s and ("clock" in s.lower()) and (clock in s.replace(",", "") or "GHz" in s)
               for s in gpu.sources), f"{name}: no source with a URL states the {clock} MHz boost clock"
    assert gpu.intra_node_fabric in {"nvswitch", "nvlink", "xgmi", "pcie"}
    # The fabric agrees with the bandwidths: a PCIe-only entry's intra-node rate is its PCIe link's.
    assert (gpu.intra_node_fabric == "pcie") == (gpu.intra_node_bw_gb_per_s <= gpu.pcie_gb_per_s)
    assert (gpu.nvlink_generation > 0) == (gpu.intra_node_fabric in {"nvswitch", "nvlink"})
    assert gpu.intra_node_link == ("pcie" if gpu.intra_node_fabric == "pcie" else "nvlink")


def test_clock_and_fabric_reference_values():
    """Spot checks against the cited sheets: A100 whitepaper 1,410 MHz and NVLink 3 via NVSwitch; V100 whitepaper
    1,530 MHz, NVLink 2 point to point (DGX-1 cube mesh); L40S (TechPowerUp) 2,520 MHz over PCIe."""
    a100, v100, l40s = get_gpu("a100-sxm-80gb"), get_gpu("v100-sxm-32gb"), get_gpu("l40s")
    assert (a100.boost_clock_mhz, a100.intra_node_fabric, a100.nvlink_generation) == (1410, "nvswitch", 3)
    assert (v100.boost_clock_mhz, v100.intra_node_fabric, v100.nvlink_generation) == (1530, "nvlink", 2)
    assert (l40s.boost_clock_mhz, l40s.intra_node_fabric, l40s.intra_node_link) == (2520, "pcie", "pcie")


@pytest.mark.parametrize("bad, match", [({"boost_clock_mhz": -1.0}, "boost_clock_mhz"),
                                        ({"intra_node_fabric": "infiniband"}, "intra_node_fabric must be one of"),
                                        ({"intra_node_fabric": "nvswitch"}, "needs an nvlink_generation"),
                                        ({"intra_node_fabric": "pcie", "nvlink_generation": 4}, "must be 0")])
def test_gpu_clock_and_fabric_are_checked(bad, match):
    d = get_gpu("h100-sxm-80gb").to_dict() | {"nvlink_generation": 0} | bad
    with pytest.raises(PerfPredictError, match=match):
        GPUSpec.from_dict(d)


def test_dense_is_half_of_sparse_for_known_parts():
    """Spot-check datasheet arithmetic: dense = sparse / 2."""
    assert get_gpu("h100-sxm-80gb").bf16_tflops == pytest.approx(1979 / 2, rel=1e-3)
    assert get_gpu("a100-sxm-80gb").bf16_tflops == pytest.approx(624 / 2)
    assert get_gpu("rtx-4090").bf16_tflops == pytest.approx(330.4 / 2)
    # The L40S datasheet itself prints 362.05 dense next to 733 sparse; the dense figure is the one kept.
    assert get_gpu("l40s").bf16_tflops == pytest.approx(362.05)
    assert get_gpu("mi300x").bf16_tflops == pytest.approx(2614.9 / 2, rel=1e-3)


def test_lookup_is_case_and_space_insensitive():
    assert get_gpu("  H100-SXM-80GB ").name == "h100-sxm-80gb"
    assert get_model(" Llama-3.1-8B").name == "llama-3.1-8b"


# --- unknown names --------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "expected"), [
    ("h100", "h100-sxm-80gb"),
    ("a100", "a100-sxm-80gb"),
    ("mi300", "mi300x"),
    ("rtx4090", "rtx-4090"),
])
def test_unknown_gpu_lists_close_names(query, expected):
    with pytest.raises(PerfPredictError) as exc:
        get_gpu(query)
    msg = str(exc.value)
    assert expected in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(("query", "expected"), [
    ("llama-3-8b", "llama-3.1-8b"),
    ("qwen2.5", "qwen2.5-7b"),
    ("mixtral", "mixtral-8x7b"),
])
def test_unknown_model_lists_close_names(query, expected):
    with pytest.raises(PerfPredictError) as exc:
        get_model(query)
    msg = str(exc.value)
    assert expected in msg, msg
    assert "\n" not in msg


# --- names a user types -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if model_catalog_raw()[n].get("hf_id")])
def test_hf_id_names_its_catalog_model(name):
    """The id a user copies from the Hub is as good as the catalog name, in any case."""
    from perfpredict.core.catalog import hf_id

    ident = model_catalog_raw()[name]["hf_id"]
    assert get_model(ident) is model_catalog()[name]
    assert get_model(ident.upper()) is model_catalog()[name]
    assert hf_id(model_catalog()[name]) == ident


def test_hf_id_not_in_the_catalog_says_a_config_path_is_accepted(tmp_path, monkeypatch):
    with pytest.raises(PerfPredictError, match=r"looks like a Hugging Face id but is not in the catalog.*config\.json"):
        get_model("some-org/Some-Model-7B")
    # A local folder of that spelling is still read as a config, as before.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 1000, "intermediate_size": 512}
    (tmp_path / "meta-llama" / "Llama-3.1-8B" / "config.json").write_text(json.dumps(cfg))
    assert get_model("meta-llama/Llama-3.1-8B").hidden == 256


def test_close_names_put_what_was_typed_first():
    from perfpredict.core.errors import close_names

    assert close_names("h100", GPU_NAMES)[:2] == ["h100-pcie-80gb", "h100-sxm-80gb"]
    assert all(n.startswith("qwen2.5-") for n in close_names("qwen2.5", MODEL_NAMES))  # every size, not 5 of 7
    assert len(close_names("qwen2.5", MODEL_NAMES)) == sum(n.startswith("qwen2.5-") for n in MODEL_NAMES)
    with pytest.raises(PerfPredictError, match=r"close names: h100-pcie-80gb, h100-sxm-80gb.*`perfpredict catalog gpus`"):
        get_gpu("h100")
    with pytest.raises(PerfPredictError, match=r"close names: llama-3\.1-.*`perfpredict catalog models`"):
        get_model("llama-3.1")
