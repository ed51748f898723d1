"""`perfpredict predict FILE`: one answer per scenario, training or generation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from perfpredict.cli._util import JsonOpt, PredictorOpt, check_outputs, command, console, err, write_text
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.formatting import num, num_range, seconds

PREDICT_KEYS = ("step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_gib", "fits", "mfu",
                "step_time_interval_s", "peak_memory_interval_gib", "breakdown", "dominant", "stall_risk",
                "stall_free_time_s", "stalled_time_s", "expected_time_s")


@command("predict")
def predict_cmd(
    file: Annotated[Path, typer.Argument(help="one scenario (JSON), a JSON list, or JSON Lines")],
    json_out: JsonOpt = None,
    predictor: PredictorOpt = None,
    explain: Annotated[bool, typer.Option(help="how each training scenario's fits verdict was reached: the memory "
                                               "reserve, the margin applied and the three-way rule")] = False,
) -> None:
    """One answer per scenario, in order: its prediction, or its error (exit code 2 if any scenario is invalid).
    Training scenarios, or `"phase": "generate"` ones (a file holds one kind)."""
    from perfpredict.api import scenario_file_phase

    check_outputs(json_out=json_out, not_same_as=file)
    if scenario_file_phase(path=file) == "generate":
        if explain:
            raise PerfPredictError("--explain explains a training scenario's fits verdict; this file holds "
                                   "generation scenarios (`generate rank --explain` covers layouts)")
        return _generation(file, json_out, predictor)
    return _training(file, json_out, predictor, explain=explain)


def _generation(file: Path, json_out: str | None, predictor: Path | None) -> None:
    from perfpredict.api import predict_generation_file

    preds = predict_generation_file(path=file, predictor=predictor)
    if json_out:
        write_text(json_out, "".join(json.dumps(p.to_dict(), default=str) + "\n" for p in preds))
        return
    t = Table("#", "layout", "out tok/s [90%]", "total tok/s", "KV tokens/replica", "time to generate", "fits")
    for i, p in enumerate(preds, 1):
        iv = p.output_tokens_per_s_interval
        t.add_row(str(i), p.layout, f"{num(p.output_tokens_per_s)} [{num_range(*iv)}]" if p.fits else "-",
                  num(p.total_tokens_per_s) if p.fits else "-", f"{p.kv_capacity_tokens:,}",
                  seconds(p.time_to_generate_s), "yes" if p.fits else f"NO: {p.reason}")
    console.print(t)


def _stable(d: dict) -> dict:
    """The output keys README promises, in their order (a Prediction field added later is not an output key)."""
    return {k: d[k] for k in PREDICT_KEYS}


def _training(file: Path, json_out: str | None, predictor: Path | None, *, explain: bool = False) -> None:
    from perfpredict.api import predict_file_items

    answers = predict_file_items(path=file, predictor=predictor)
    bad = [it for it, _ in answers if it.error]
    if len(answers) == 1 and bad and not json_out:
        raise PerfPredictError(bad[0].error)  # one scenario: its error is the whole answer
    if json_out:
        lines = [json.dumps(_stable(p.to_dict()) | it.location()
                            | ({"fit_explanation": p.fit_explanation} if explain else {})) if p is not None else
                 json.dumps({"error": it.error, **it.location()}) for it, p in answers]
        write_text(json_out, "\n".join(lines) + "\n")
    else:
        # The step is the stall-free one unless a stall is likely (models.stall.point_time), its interval covers
        # both regimes; P(stall) says how likely a cross-node pipeline is to stall, and what a stalled step takes.
        t = Table("#", "step s [90%]", "P(stall): stalled s", "tokens/s", "samples/s", "peak GiB [90%]", "fits",
                  "MFU", "dominated by")
        for it, p in answers:
            where = f"{it.where} {it.at}"
            if p is None:
                t.add_row(where, "[red]invalid[/]", "-", "-", "-", "-", "-", "-", "-")
                continue
            stall = (f"{100 * p.stall_risk:.0f}%: {p.stalled_time_s:.3g}" if p.stall_risk >= 0.005 else "-")
            t.add_row(where, f"{p.step_time_s:.3g} [{p.step_time_interval_s[0]:.3g}-{p.step_time_interval_s[1]:.3g}]",
                      stall, num(p.tokens_per_s), num(p.samples_per_s),
                      f"{p.peak_memory_gib:.1f} [{p.peak_memory_interval_gib[0]:.1f}-"
                      f"{p.peak_memory_interval_gib[1]:.1f}]", f"{p.fit_verdict} (P OOM {100 * p.oom_risk:.0f}%)",
                      f"{100 * p.mfu:.0f}%",
                      p.dominant)
        console.print(t)
        if explain:
            for it, p in answers:
                if p is not None:
                    console.print(f"{it.where} {it.at}: {p.fit_explanation}", markup=False, highlight=False,
                                  soft_wrap=True)
    if bad:
        for it in bad if len(answers) > 1 else []:
            err.print(f"{it.where} {it.at}: {it.error}", markup=False, highlight=False, soft_wrap=True)
        raise PerfPredictError(f"{len(bad)} of {len(answers)} scenarios are invalid "
                               f"({', '.join(f'{it.where} {it.at}' for it in bad[:10])}"
                               f"{', ...' if len(bad) > 10 else ''}); the others were answered")
