"""`perfpredict plans` and `perfpredict describe`: the legal plan space and a scenario's descriptors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from perfpredict.cli._util import (
    FrameworkOpt,
    GlobalBatchOpt,
    GpuOpt,
    GpusPerNodeOpt,
    JsonOpt,
    ModelOpt,
    ObjectiveOpt,
    SeqLenOpt,
    check_outputs,
    command,
    console,
    write_text,
)


@command("plans")
def plans_cmd(
    model: ModelOpt,
    gpu: GpuOpt,
    gpus: Annotated[int, typer.Option(help="total GPUs")] = 8,
    gpus_per_node: GpusPerNodeOpt = 8,
    global_batch: GlobalBatchOpt = 64,
    seq_len: SeqLenOpt = 2048,
    objective: ObjectiveOpt = "dpo",
    sample: Annotated[int, typer.Option(help="how many plans to show")] = 10,
    framework: FrameworkOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Count the legal plans for a model on a cluster, show a sample and the rejection tally."""
    from perfpredict.api import legal_plans
    from perfpredict.core.errors import check_int

    check_int("--sample", sample, 0, 1 << 20)
    check_outputs(json_out=json_out)
    plans, rej = legal_plans(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node,
                             global_batch=global_batch, seq_len=seq_len, objective=objective, frameworks=framework)
    if json_out:
        write_text(json_out, json.dumps({"plans": [p.to_dict() | {"plan": p.label()} for p in plans],
                                         "rejected": dict(rej.counts.most_common())}))
        return
    console.print(f"[bold]{len(plans):,}[/] legal plans, {rej.total:,} candidates rejected")
    step = max(1, len(plans) // max(sample, 1))
    t = Table("framework", "tp", "pp", "dp", "cp", "ep", "sp", "zero", "mbs", "ga", "recompute", "schedule", "offload",
              "stages")
    for p in plans[::step][:sample]:
        t.add_row(p.framework, str(p.tp), str(p.pp), str(p.dp), str(p.cp), str(p.ep),
                  "y" if p.sequence_parallel else "-", str(p.zero), str(p.micro_batch), str(p.grad_accum), p.recompute,
                  p.schedule + (f"/v{p.virtual_stages}" if p.virtual_stages > 1 else ""),
                  ("y+params" if p.param_offload else "y") if p.optimizer_offload else "-",
                  ",".join(map(str, p.stage_layers)) or "even")
    console.print(t)
    r = Table("rejected because", "count")
    for reason, n in rej.counts.most_common():
        r.add_row(reason, f"{n:,}")
    console.print(r)


@command("describe")
def describe_cmd(scenario: Annotated[Path, typer.Argument(help="scenario JSON file")], json_out: JsonOpt = None) -> None:
    """The analytic descriptors of one scenario, as a table."""
    from perfpredict.api import describe_scenarios

    check_outputs(json_out=json_out, not_same_as=scenario)
    df = describe_scenarios(path=scenario)
    if json_out:
        write_text(json_out, json.dumps(df.to_dicts(), default=str))
        return
    for i, row in enumerate(df.to_dicts()):
        t = Table("descriptor", "value", title=f"scenario {i + 1}")
        for k, v in row.items():
            if k.startswith("d_"):
                t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
        console.print(t)
