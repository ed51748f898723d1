"""Fast checks of the collect building blocks (no torchrun)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from perfpredict.collect import fingerprint, timing  # noqa: E402
from perfpredict.collect.harness import objectives  # noqa: E402
from perfpredict.collect.harness.model import build_model, shrink  # noqa: E402
from perfpredict.collect.harness.parallel import build_runner, check_plan  # noqa: E402
from perfpredict.collect.harness.sweep import SHAPES, estimate_step_s, sample_plans  # noqa: E402
from perfpredict.core.catalog import get_model  # noqa: E402
from perfpredict.core.errors import PerfPredictError  # noqa: E402
from perfpredict.core.model import ModelSpec  # noqa: E402
from perfpredict.core.plan import Plan  # noqa: E402
from perfpredict.core.workload import Workload  # noqa: E402


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-2b"])
def test_shrink_keeps_ratios_and_param_count_matches_model(name):
    base = get_model(name)
    s = shrink(base, hidden=256, layers=2)
    assert s.layers == 2 and s.hidden == 256
    assert s.heads // s.kv_heads == base.heads // base.kv_heads
    ffn_ratio = (s.expert_ffn or s.ffn) / s.hidden
    assert ffn_ratio == pytest.approx((base.expert_ffn or base.ffn) / base.hidden, rel=0.1)
    assert (s.experts, s.experts_per_token) == (base.experts, base.experts_per_token)
    m = build_model(s)
    assert sum(p.numel() for p in m.parameters()) == s.param_count


def test_model_is_deterministic_and_causal():
    spec = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=128)
    a, b = build_model(spec, seed=3), build_model(spec, seed=3)
    x = torch.randint(0, 128, (2, 16))
    ya = a(x)
    assert torch.equal(ya, b(x))
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 128
    assert torch.allclose(a(x2)[:, :-1], ya[:, :-1], atol=1e-5)  # the future does not leak


def test_dpo_loss_matches_hand_computation():
    obj = objectives.Objective("dpo", "precomputed", beta=0.5)
    logps = torch.tensor([-1.0, -2.0, -4.0, -3.0])  # concat: chosen 0,1 then rejected 0,1
    ref = torch.tensor([-1.5, -2.0, -3.5, -3.5])
    got = objectives.preference_loss(obj, logps, torch.ones(4), ref)
    margin = torch.tensor([(-1 + 1.5) - (-4 + 3.5), (-2 + 2) - (-3 + 3.5)])
    assert torch.isclose(got, -torch.nn.functional.logsigmoid(0.5 * margin).mean())
    inter = objectives.Objective("dpo", "precomputed", beta=0.5, layout="interleave")
    perm = torch.tensor([0, 2, 1, 3])
    assert torch.isclose(objectives.preference_loss(inter, logps[perm], torch.ones(4), ref[perm]), got)


def test_sequence_logps_counts_only_response_tokens():
    obj = objectives.Objective("dpo", "live")
    src = objectives.make_samples(obj, samples=2, seq_len=8, vocab=16, seed=0)
    assert src.rows == 4
    assert torch.equal(src.input_ids[0, :4], src.input_ids[1, :4])  # a pair shares its prompt
    logits = torch.zeros(4, 8, 16)
    lp, n = objectives.sequence_logps(logits, src.labels)
    assert torch.equal(n, torch.full((4,), 4))  # positions 3..6 predict response tokens 4..7
    assert torch.allclose(lp, -4 * torch.log(torch.tensor(16.0)))
    tgt = objectives.pack_target(src.labels, lp)
    labels, ref = objectives.unpack_target(tgt)
    assert torch.equal(labels, src.labels) and torch.equal(ref, lp)


def test_reference_pairing_is_checked():
    with pytest.raises(PerfPredictError):
        objectives.Objective("dpo", "none")
    with pytest.raises(PerfPredictError):
        objectives.Objective("simpo", "live")


@pytest.mark.parametrize("objective,ref", [("dpo", "live"), ("ipo", "precomputed"), ("simpo", "none"),
                                           ("orpo", "none"), ("sft", "none"), ("pretrain", "none")])
def test_single_process_step_reduces_loss(objective, ref):
    spec = ModelSpec(name="t", layers=1, hidden=32, heads=2, kv_heads=1, ffn=64, vocab=64)
    w = Workload(objective=objective, reference=ref, seq_len=16, global_batch=2, precision="fp32")
    r = build_runner(spec, w, Plan(micro_batch=1, grad_accum=2), rank=0, world=1, device=torch.device("cpu"))
    losses = [float(r.step()) for _ in range(4)]
    assert all(map(lambda v: v == v, losses))
    assert losses[-1] < losses[0]


def test_check_plan_messages():
    spec = SHAPES["llama-3.2-1b@256x4"].spec()
    w = Workload(objective="dpo", seq_len=128, global_batch=2)
    with pytest.raises(PerfPredictError, match="zero"):
        check_plan(spec, w, Plan(tp=2, dp=2, micro_batch=1, zero=0), 4)
    with pytest.raises(PerfPredictError, match="global_batch"):
        check_plan(spec, w, Plan(dp=2, micro_batch=2), 2)
    with pytest.raises(PerfPredictError, match="context"):
        check_plan(spec, Workload(objective="dpo", seq_len=128, global_batch=1), Plan(cp=2, micro_batch=1), 2)


def test_sample_plans_spans_the_space():
    plans = sample_plans(n=150, seed=0, cores=2)
    assert len(plans) == 150
    strategies = Counter((p.tp > 1, p.pp > 1, p.dp > 1, p.zero) for _, _, p in plans)
    assert len(strategies) >= 7
    assert {w.objective for _, w, _ in plans} == {"dpo", "ipo", "simpo", "orpo", "sft", "pretrain"}
    assert {w.reference for _, w, _ in plans} == {"live", "precomputed", "none"}
    assert {p.recompute for _, _, p in plans} == {"none", "selective", "full"}
    assert {p.gpus for _, _, p in plans} >= {1, 2, 4}
    assert {p.schedule for _, _, p in plans if p.pp > 1} == {"gpipe", "1f1b"}
    assert len({s.key for s, _, _ in plans}) >= 5 and any(SHAPES[s.key].spec().is_moe for s, _, _ in plans)
    for s, w, p in plans:
        check_plan(s.spec(), w, p, p.gpus)
        assert estimate_step_s(s.spec(), w, p, 2) <= 5.0
    again = sample_plans(n=150, seed=0, cores=2)
    assert [(s.key, w, p) for s, w, p in again] == [(s.key, w, p) for s, w, p in plans]


def test_timing_helpers():
    t = timing.measure(lambda: sum(range(1000)), warmup=1, min_repeats=5, max_repeats=10)
    assert 5 <= t.repeats <= 10 and t.median_s > 0 and t.cv >= 0
    assert timing.calibrate(rounds=1, inner=2) > 0
    s = timing.LoadSampler(interval_s=0.05).start()
    load = s.stop()
    assert load >= 0 and 0 <= s.steal_cores <= (os.cpu_count() or 1)


def test_load_readings_never_exceed_the_machines_cpus():
    # A CI run read 7.5 cores of steal on a 2-CPU machine: one 10 ms /proc/stat tick over a ~1 ms window.
    cpus = os.cpu_count() or 1
    assert timing.cores_over(0.01, 0.0013) == min(0.01 / 0.0013, cpus)
    assert timing.cores_over(2.0 * cpus * 0.0013, 0.0013) == cpus
    assert timing.cores_over(-0.01, 1.0) == 0.0
    assert timing.cores_over(0.5, 1.0) == min(0.5, cpus)
    assert timing.cores_over(0.01, 0.0) == cpus


def test_gpu_device_names_map_to_catalog_entries():
    from perfpredict.core.catalog import gpu_catalog

    assert set(fingerprint.GPU_CATALOG_NAMES.values()) <= set(gpu_catalog())


def test_fingerprint_is_json_and_hash_stable():
    fp = fingerprint.hardware_fingerprint()
    assert fp["cpu_cores"] >= 1 and fp["device"] == "cpu"
    json.loads(fingerprint.dumps(fp))
    assert "torch" in fingerprint.software_fingerprint()
    h = fingerprint.short_hash()
    assert h.startswith("cpu-") and h == fingerprint.short_hash()


def test_cli_rejects_bad_input():
    from typer.testing import CliRunner

    from perfpredict.cli import app

    for args, msg in ((["runs", "--plans", "0"], "--plans"), (["runs", "--models", "nope"], "nope"),
                      (["runs", "--timeout", "0"], "--timeout")):
        res = CliRunner().invoke(app, ["collect", *args])
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("args,expect", [
    (["runs", "--plans", "1", "--models", "nope"], "unknown sweep model 'nope'; accepted: "),
    (["runs", "--plans", "0"], "--plans must be >= 1"),
])
def test_collect_cli_bad_input_is_one_line(args, expect):
    from typer.testing import CliRunner

    from perfpredict.cli import app

    r = CliRunner().invoke(app, ["collect", *args])
    assert r.exit_code == 2
    assert expect in r.output and "Traceback" not in r.output


def test_sdpa_impl_names_the_backend_that_ran():
    """The attention probes' attn_impl comes from the op SDPA dispatched to: the fused CPU kernel by default (for
    GQA too), the unfused math path when only that backend is allowed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from perfpredict.collect.probes.suite import sdpa_impl

    q = torch.randn(1, 4, 64, 32)
    kv = torch.randn(1, 2, 64, 32)
    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True,  # noqa: E731
                                                                   enable_gqa=True)
    assert sdpa_impl(fn) == "sdpa-cpu"
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_impl(fn) == "math"
