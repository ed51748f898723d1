"""Train, evaluate and load on a small subset of the committed datasets (fast enough for CI)."""

import json
import shutil
import sys

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from perfpredict.cli import app
from perfpredict.core.dataset import read_tables, write_atomic
from perfpredict.core.errors import PerfPredictError
from perfpredict.models.bundle import MODEL_SCHEMA_VERSION, Bundle
from perfpredict.models.kernels import KernelModel
from perfpredict.train.data import load_runs

runner = CliRunner()
MEASURED_SOURCES = {"ours-cpu", "ours-gpu", "vtrain", "ultrascale_playbook", "vidur", "azure_ai_benchmarking",
                    "aiconfigurator",
                    # published GPU fine-tuning runs transcribed from upstream text (tests/test_finetune_sources.py)
                    "msswift_examples", "nemo_automodel", "liger_hf_examples", "alignment_handbook",
                    "hf_blog_ds_fsdp",
                    # published out-of-memory / ran outcomes, each row citing its report (tests/test_oom_reports.py)
                    "oom_reports"}


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    probes = read_tables("datasets", "probes")
    runs = read_tables("datasets", "runs")
    # Keep every (hardware, op) family but few rows of each; runs: a slice of every source.
    probes = probes.group_by("hardware", "op", maintain_order=True).head(120)
    runs = runs.group_by("source", "m_name", maintain_order=True).head(40)
    write_atomic(probes, root / "probes.parquet")
    write_atomic(runs, root / "runs.parquet")
    return root


@pytest.fixture(scope="module")
def trained(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    r = runner.invoke(app, ["train", "--data", str(small_data), "--out", str(out), "--seed", "3"])
    assert r.exit_code == 0, r.output
    return out


def test_train_writes_xgboost_json_and_metadata(trained):
    meta = json.loads((trained / "metadata.json").read_text())
    assert meta["model_schema_version"] == MODEL_SCHEMA_VERSION and meta["corrections"]["time"]["features"] and meta["data_hash"]["runs"]
    assert {"xgboost", "polars", "numpy"} <= set(meta["versions"])
    assert not list(trained.glob("*.pkl")) and not list(trained.glob("*.joblib"))
    for name in meta["files"].values():
        if name.endswith(".npy"):  # the corrections' training matrices (applicability domain), no pickle
            assert np.load(trained / name, allow_pickle=False).ndim == 2
        else:
            json.loads((trained / name).read_text())  # xgboost JSON, not a pickle


def test_training_is_deterministic(small_data, trained, tmp_path):
    r = runner.invoke(app, ["train", "--data", str(small_data), "--out", str(tmp_path), "--seed", "3"])
    assert r.exit_code == 0, r.output
    for name in ("plan_time.json", "plan_memory.json", "kernel_gemm.json"):
        assert (tmp_path / name).read_text() == (trained / name).read_text()


def test_load_refuses_mismatch(trained, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(trained, bad)
    meta = json.loads((bad / "metadata.json").read_text())
    meta["model_schema_version"] = 999
    (bad / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PerfPredictError, match="retrain"):
        Bundle.load(bad)
    meta["model_schema_version"] = MODEL_SCHEMA_VERSION
    meta["versions"]["xgboost"] = "0.9"
    (bad / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PerfPredictError, match="xgboost 0.9"):
        Bundle.load(bad)
    with pytest.raises(PerfPredictError, match="metadata.json missing"):
        Bundle.load(tmp_path / "nowhere")
    meta["versions"]["xgboost"] = json.loads((trained / "metadata.json").read_text())["versions"]["xgboost"]
    for key, value, msg in (("launch_floor_s", {"gpu": -1.0}, r"launch_floor_s\['gpu'\] = -1.0"),
                            ("launch_floor_s", {"tpu": 1e-5}, "launch_floor_s"),
                            ("launch_floor_s", {"gpu_hidden:megatron": 2.0}, "_hidden share"),
                            ("trl_calibration", {"gemm_scale": "fast"}, r"trl_calibration\['gemm_scale'\]"),
                            ("trl_calibration", {"speed": 1.0}, "expected keys among")):
        (bad / "metadata.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises(PerfPredictError, match=msg):
            Bundle.load(bad)
    # A bundle trained before TRL rows has no calibration: the defaults compose its steps.
    (bad / "metadata.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "trl_calibration"}))
    assert Bundle.load(bad).trl_calibration is None


def test_feature_list_mismatch_is_refused(trained):
    b = Bundle.load(trained)
    b.time.feature_names_ = b.time.feature_names_[:-1]
    from perfpredict.predictor.predict import predict

    with pytest.raises(PerfPredictError, match="other features"):
        predict(json.loads(open("examples/scenario-8b-dpo.json").read()), bundle=b)


def test_evaluate_command(small_data, tmp_path):
    plot = tmp_path / "pvm.png"
    js = tmp_path / "metrics.json"
    r = runner.invoke(app, ["evaluate", "--data", str(small_data), "--split", "scale", "--split", "largest",
                            "--plot", str(plot), "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "test partition" in r.output and "MAPE" in r.output
    assert plot.stat().st_size > 10_000
    metrics = json.loads(js.read_text())
    assert {row["split"] for row in metrics} == {"scale", "largest"}
    # (the TRL rows, tagged {"table": "trl"}, are per trainer x reference mode: oom_reports' open-r1 row is one)
    assert {row["source"] for row in metrics if row["split"] == "largest" and "table" not in row} >= {
        "vtrain", "ultrascale_playbook"}
    assert all(0.0 <= row["time_coverage"] <= 1.0 for row in metrics if row["time_n"])


def test_evaluate_json_dash_is_stdout(small_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file named "-" would land here
    r = runner.invoke(app, ["evaluate", "--data", str(small_data.resolve()), "--split", "largest", "--json", "-"])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "-").exists()
    assert {row["split"] for row in json.loads(r.output)} == {"largest"}


def test_bogus_split_is_one_line(small_data):
    r = runner.invoke(app, ["evaluate", "--data", str(small_data), "--split", "bogus"])
    assert r.exit_code == 2 and "unknown split/variant" in r.output


def test_split_without_training_rows_is_one_line(small_data):
    # The playbook alone, leave-one-model-out: its 8B is the test partition and the 1B is held out, so nothing is
    # left to train on.
    r = runner.invoke(app, ["evaluate", "--data", str(small_data), "--source", "ultrascale_playbook",
                            "--split", "model"])
    assert r.exit_code == 2 and "leaves both training and held-out rows" in r.output, r.output


def test_every_label_was_measured():
    """Nothing in any training label comes from our formulas: each runs row names a measured source and the
    command that produced it."""
    runs = read_tables("datasets", "runs")
    probes = read_tables("datasets", "probes")
    trl = read_tables("datasets", "trl")  # collect trl's rows, where committed
    for df in (runs, probes, *([trl] if trl.height else [])):
        assert set(df["source"].unique().to_list()) <= MEASURED_SOURCES
        assert df["command"].null_count() == 0 and df["collected_at"].null_count() == 0
        assert df["hardware_fingerprint"].null_count() == 0
    # A run that ran carries what was measured; oom_reports' ran rows are fit outcomes only (the report says it ran).
    labelled = runs.filter((pl.col("outcome") == "ok") & (pl.col("source") != "oom_reports"))
    assert (labelled["step_time_s"].is_not_null() | labelled["peak_memory_gib"].is_not_null()).all()


def test_new_hardware_probes_improve_its_kernel_error():
    """'We just got a new GPU': kernels trained without a40 probes, then with half of them; the error on the
    other half must drop. (vidur a40 GEMMs: shared/data/public/vidur, imported into datasets/public/vidur.)"""
    probes = read_tables("datasets", "probes").filter(pl.col("op") == "gemm")
    new = probes.filter(pl.col("hardware") == "a40").sample(fraction=1.0, seed=0, shuffle=True)
    rest = probes.filter(pl.col("hardware") != "a40").group_by("hardware", maintain_order=True).head(1500)
    half = new.height // 2
    added, test = new.head(half), new.tail(new.height - half)
    err = {}
    for name, train in (("without", rest), ("with", pl.concat([rest, added], how="diagonal_relaxed"))):
        k = KernelModel(seed=0, params=dict(n_estimators=150, max_depth=6, learning_rate=0.1, tree_method="hist",
                                            n_jobs=2)).fit(train)
        err[name] = float(np.median(np.abs(k.predict(test) / test["time_s"].to_numpy() - 1)))
    assert err["with"] < 0.5 * err["without"], err


def test_shipped_default_predicts_without_torch(no_torch):
    for mod in [m for m in sys.modules if m.startswith("perfpredict.predictor") or m == "perfpredict.api"]:
        sys.modules.pop(mod)
    from perfpredict.api import predict

    p = predict(json.loads(open("examples/scenario-8b-pretrain.json").read()))
    assert 0 < p.step_time_s < 1e4 and 0 < p.peak_memory_gib < 1e3
    assert p.step_time_interval_s[0] <= p.step_time_s <= p.step_time_interval_s[1]
    assert p.tokens_per_s == pytest.approx(256 * 4096 / p.step_time_s)
    assert "torch" not in sys.modules


def test_load_runs_describes_every_row():
    runs = load_runs("datasets/public")
    assert runs["d_mem_gib"].null_count() == 0 and (runs["d_analytic_step_s"] > 0).all()
