"""docs/accuracy.md is exactly what the committed evaluation JSON produces, and the page builder is pure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfpredict.core.errors import PerfPredictError
from perfpredict.train.report import accuracy_markdown, count, pct, plain, write_accuracy_page

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _inputs() -> tuple[list, dict]:
    return (json.loads((DOCS / "evaluation.json").read_text()),
            json.loads((DOCS / "generate-evaluation.json").read_text()))


def test_committed_accuracy_page_is_generated_from_the_committed_json() -> None:
    evaluation, gen = _inputs()
    held = json.loads((DOCS / "held-out-sources.json").read_text())
    expected = accuracy_markdown(evaluation=evaluation, generate_evaluation=gen, held_out_evaluation=held)
    assert (DOCS / "accuracy.md").read_text() == expected, (
        "docs/accuracy.md is stale: regenerate it with `perfpredict report` (write_accuracy_page)")


def test_page_is_deterministic_and_does_not_change_its_input() -> None:
    evaluation, gen = _inputs()
    before = json.dumps([evaluation, gen], sort_keys=True, default=str)
    first = accuracy_markdown(evaluation=evaluation, generate_evaluation=gen)
    assert accuracy_markdown(evaluation=evaluation, generate_evaluation=gen) == first
    assert json.dumps([evaluation, gen], sort_keys=True, default=str) == before


def test_page_holds_the_numbers_people_look_for() -> None:
    evaluation, gen = _inputs()
    page = accuracy_markdown(evaluation=evaluation, generate_evaluation=gen)
    shipped = next(r for r in evaluation if r.get("table") is None and r["variant"] == "scale-free+domain"
                   and r["split"] == "largest" and r["source"] == "vtrain")
    row = next(line for line in page.splitlines() if line.startswith("| largest (test) | vtrain |"))
    for key in ("time_mape", "time_composed_mape", "time_coverage", "false_oom"):
        assert pct(shipped[key]) in row
    for heading in ("90% cover", "false OOM", "composition alone", "TRL trainer x reference", "output tok/s MAPE"):
        assert heading in page
    assert "issue" not in page.lower()


def test_page_without_generation_or_extra_variants() -> None:
    evaluation, _ = _inputs()
    shipped = [r for r in evaluation if r["variant"] == "scale-free+domain"]
    page = accuracy_markdown(evaluation=shipped)
    assert "## Generation with vLLM" not in page
    assert "variants side by side" not in page
    assert page.endswith("\n") and not page.endswith("\n\n")


def test_interval_widths_are_shown_when_the_evaluation_has_them() -> None:
    evaluation, _ = _inputs()
    rows = [dict(r, time_interval_width=0.5) for r in evaluation if r["variant"] == "scale-free+domain"]
    page = accuracy_markdown(evaluation=rows)
    assert "| width |" in page and "50.0%" in page


def test_formatting_for_people() -> None:
    assert pct(0.12345) == "12.3%" and pct(float("nan")) == "-" and pct(None) == "-"
    assert count(1260) == "1,260" and count(math.nan) == "-"
    assert plain(0.875) == "0.88"


@pytest.mark.parametrize("bad", [{}, [1, 2], [{"split": "model"}], [{"variant": "a", "split": "model", "table": "trl"}]])
def test_bad_evaluation_is_one_clear_error(bad) -> None:
    with pytest.raises(PerfPredictError):
        accuracy_markdown(evaluation=bad)


def test_write_accuracy_page(tmp_path: Path) -> None:
    out = write_accuracy_page(evaluation_path=DOCS / "evaluation.json",
                              generate_evaluation_path=DOCS / "generate-evaluation.json", out_path=tmp_path / "a.md",
                              held_out_evaluation_path=DOCS / "held-out-sources.json")
    assert out.read_text() == (DOCS / "accuracy.md").read_text()
    with pytest.raises(PerfPredictError, match="not found"):
        write_accuracy_page(evaluation_path=tmp_path / "missing.json", generate_evaluation_path=None,
                            out_path=tmp_path / "b.md")
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(PerfPredictError, match="not JSON"):
        write_accuracy_page(evaluation_path=tmp_path / "junk.json", generate_evaluation_path=None,
                            out_path=tmp_path / "c.md")


def test_held_out_sources_section() -> None:
    """The published GPU fine-tuning sources' section: per source and per model, the composition beside the learned
    result, and one line per run; absent when no held-out evaluation is given."""
    evaluation, gen = _inputs()
    held = json.loads((DOCS / "held-out-sources.json").read_text())
    page = accuracy_markdown(evaluation=evaluation, generate_evaluation=gen, held_out_evaluation=held)
    assert "## Published GPU fine-tuning runs: held out by source and by model" in page
    row = next(r for r in held if r.get("split") == "source" and r["source"] == "msswift_examples")
    line = next(x for x in page.splitlines() if x.startswith("| source | msswift_examples |"))
    for key in ("time_mape", "time_composed_mape", "mem_mape", "false_oom"):
        assert pct(row[key]) in line
    runs = [r for r in held if r.get("table") == "run"]
    assert len(runs) == sum(1 for x in page.splitlines() if x.startswith(("| msswift_examples `", "| nemo_automodel `")))
    assert "held out by source" not in accuracy_markdown(evaluation=evaluation, generate_evaluation=gen)
    with pytest.raises(PerfPredictError, match="held-out evaluation"):
        accuracy_markdown(evaluation=evaluation, held_out_evaluation={"not": "a list"})

