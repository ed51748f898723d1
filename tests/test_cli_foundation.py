from typer.testing import CliRunner

from perfpredict.cli import app

runner = CliRunner()


def test_plans_command():
    r = runner.invoke(app, ["plans", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "16",
                            "--global-batch", "64"])
    assert r.exit_code == 0, r.output
    assert "legal plans" in r.output and "rejected because" in r.output


def test_describe_command():
    r = runner.invoke(app, ["describe", "examples/scenario-8b-pretrain.json"])
    assert r.exit_code == 0, r.output
    assert "d_mem_gib" in r.output


def test_catalog_command():
    r = runner.invoke(app, ["catalog", "models"])
    assert r.exit_code == 0 and "llama-3.1-8b" in r.output


def _one_line_error(r, *fragments):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    out = r.output.strip()
    assert out.startswith("error:") and out.count("\n") == 0, out
    for f in fragments:
        assert f in out, out


def test_unknown_gpu_lists_close_names():
    r = runner.invoke(app, ["plans", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "8"])
    _one_line_error(r, "unknown GPU 'h100'", "h100-sxm-80gb")


def test_unknown_model():
    r = runner.invoke(app, ["plans", "--model", "llama-9b", "--gpu", "h100-sxm-80gb"])
    _one_line_error(r, "unknown model", "llama")


def test_negative_sizes():
    r = runner.invoke(app, ["plans", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--seq-len", "-1"])
    _one_line_error(r, "seq_len must be an integer in 1..16777216")


def test_tp_not_dividing_heads(tmp_path):
    p = tmp_path / "s.json"
    p.write_text('{"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 3, "nodes": 1},'
                 ' "plan": {"tp": 3}}')
    r = runner.invoke(app, ["describe", str(p)])
    _one_line_error(r, "tp (3) must divide")


def test_malformed_json(tmp_path):
    p = tmp_path / "s.json"
    p.write_text("{not json")
    r = runner.invoke(app, ["describe", str(p)])
    _one_line_error(r, "not valid JSON")


def test_missing_file():
    r = runner.invoke(app, ["describe", "/nonexistent/s.json"])
    _one_line_error(r, "cannot read scenario file")
