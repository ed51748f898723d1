"""FSDP2 + TP (DTensor) target: the config of the trainer that runs the plan's objective (core.frameworks' Trainer
rows for `fsdp2`) and the script that launches it.

- pretraining: torchtitan. Its runs are Python configurations (torchtitan/config/README.md: "Select one with
  `--module` ... and `--config`"; the `--section.option` flags are frozen), so this writes a module with one function
  that derives the Llama 3 baseline (torchtitan/models/llama3/config_registry.py llama3_8b) and sets
  ParallelismConfig.data_parallel_shard_degree / tensor_parallel_degree / enable_sequence_parallel /
  fsdp_reshard_after_forward, TrainingConfig.num_tokens_per_microbatch_per_dp_rank / num_tokens_per_train_step /
  max_context_length / enable_cpu_offload (torchtitan/config/configs.py) and the activation checkpointing policy
  (torchtitan/distributed/activation_checkpoint.py SelectiveAC per op, FullAC per block).
- SFT and DPO: NeMo-RL's DTensor policy worker, `uv run examples/run_{sft,dpo}.py --config ... key=value` overrides
  (tests/test_suites/llm/dpo-*-fsdp2tp*.sh) of policy.dtensor_cfg (enabled, tensor_parallel_size,
  sequence_parallel, activation_checkpointing, cpu_offload), policy.train_global_batch_size /
  train_micro_batch_size (pairs for DPO) / max_total_sequence_length and cluster.gpus_per_node / num_nodes
  (examples/configs/dpo.yaml).
"""

from __future__ import annotations

from perfpredict.core.frameworks import capability
from perfpredict.predictor.emit.common import Ctx, comment_block

# torchtitan's Llama 3 flavors (torchtitan/models/llama3: model_registry "8B", "70B", "405B") by layer count.
_TORCHTITAN_FLAVOR = {32: "8B", 80: "70B", 126: "405B"}


def _torchtitan_files(ctx: Ctx) -> dict[str, str]:
    p, w, c, m = ctx.plan, ctx.workload, ctx.cluster, ctx.model
    flavor = _TORCHTITAN_FLAVOR.get(m.layers) if "llama-3" in m.name.lower() else None
    ac = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}[p.recompute]
    reshard = "always" if p.zero == 3 else "never"
    notes = [f"torchtitan configuration for {m.name}: FSDP2 over dp {p.dp} (zero {p.zero}: reshard_after_forward "
             f"{reshard}), TP {p.tp}{' with sequence parallel' if p.sequence_parallel else ''}, "
             f"{w.global_batch // (p.dp * p.micro_batch)} micro-batches of {p.micro_batch} x {w.seq_len} tokens "
             "per dp rank and step, recompute "
             + {"none": "off", "selective": "per op (SelectiveAC)", "full": "per block (FullAC)"}[p.recompute] + "."]
    if flavor is None:
        notes.append(f"torchtitan ships Llama 3 flavors 8B/70B/405B; for {m.name} replace model_registry(...) with "
                     "its own model spec.")
    body = [
        "from torchtitan.config import ParallelismConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401",
        "from torchtitan.models.llama3 import model_registry",
        "from torchtitan.models.llama3.config_registry import llama3_8b",
        "",
        "",
        "def perfpredict_plan():",
        "    config = llama3_8b()",
        f"    config.model_spec = model_registry({flavor or '8B'!r})",
        "    config.hf_assets_path = './assets/hf/<your-model>'",
        "    config.parallelism = ParallelismConfig(",
        f"        data_parallel_shard_degree={p.dp},",
        f"        tensor_parallel_degree={p.tp},",
        f"        enable_sequence_parallel={p.sequence_parallel and p.tp > 1},",
        f"        fsdp_reshard_after_forward={reshard!r},",
        "    )",
        f"    config.training.num_tokens_per_microbatch_per_dp_rank = {p.micro_batch * w.seq_len}",
        f"    config.training.num_tokens_per_train_step = {w.global_batch * w.seq_len}",
        f"    config.training.max_context_length = {w.seq_len}",
        f"    config.training.enable_cpu_offload = {p.optimizer_offload}",
        f"    config.activation_checkpoint = {ac}",
        "    return config",
    ]
    module = comment_block(ctx.header + [""] + notes) + "\n".join(body) + "\n"
    launch = ("#!/usr/bin/env bash\n" + comment_block(ctx.header + ["", "Run from a torchtitan checkout, once per "
                                                                    "node (torchrun's rendezvous in run_train.sh)."])
              + "set -euo pipefail\n"
              + f'PYTHONPATH="$(dirname "$0"):${{PYTHONPATH:-}}" NGPU={c.gpus_per_node} '
              + "MODULE=perfpredict_torchtitan CONFIG=perfpredict_plan ./run_train.sh \"$@\"\n")
    return {"perfpredict_torchtitan.py": module, "launch.sh": launch}


def nemo_rl_overrides(ctx: Ctx) -> list[str]:
    p, w, c = ctx.plan, ctx.workload, ctx.cluster
    precision = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[w.precision]
    out = [
        f"cluster.gpus_per_node={c.gpus_per_node}", f"cluster.num_nodes={c.nodes}",
        f"policy.model_name={ctx.model_id}",
        f"policy.train_global_batch_size={w.global_batch}", f"policy.train_micro_batch_size={p.micro_batch}",
        f"policy.max_total_sequence_length={w.seq_len}", f"policy.precision={precision}",
        "policy.dtensor_cfg.enabled=true", f"policy.dtensor_cfg.tensor_parallel_size={p.tp}",
        f"policy.dtensor_cfg.sequence_parallel={'true' if p.sequence_parallel else 'false'}",
        "policy.dtensor_cfg.activation_checkpointing=false",
        f"policy.dtensor_cfg.cpu_offload={'true' if p.optimizer_offload else 'false'}",
    ]
    if w.objective == "dpo":
        out.append("dpo.reference_policy_kl_penalty=0.1")
    return out


def _nemo_rl_files(ctx: Ctx) -> dict[str, str]:
    w = ctx.workload
    script = {"dpo": "examples/run_dpo.py", "sft": "examples/run_sft.py"}[w.objective]
    config = {"dpo": "examples/configs/dpo.yaml", "sft": "examples/configs/sft.yaml"}[w.objective]
    notes = [f"NeMo-RL {w.objective.upper()} on its DTensor policy worker (FSDP2 over dp, DTensor TP over tp); "
             "policy.train_*_batch_size count " + ("pairs" if w.is_preference else "sequences") + ".",
             "Run from a NeMo-RL checkout; it starts its own Ray cluster over cluster.num_nodes nodes."]
    if w.is_preference:
        notes.append("NeMo-RL keeps the reference policy's weights in pinned host memory and copies them into the "
                     "model to score each batch (dtensor_policy_worker.py use_reference_model); perfpredict predicts "
                     f"the plan that way (reference offloaded; workload reference: {w.reference}).")
    lines = [f"uv run {script}", f"--config {config}", *nemo_rl_overrides(ctx), '"$@"']
    text = ("#!/usr/bin/env bash\n" + comment_block(ctx.header + [""] + notes) + "set -euo pipefail\n"
            + " \\\n  ".join(lines) + "\n")
    return {"launch.sh": text}


def fsdp2_files(ctx: Ctx) -> dict[str, str]:
    trainer = capability(ctx.plan.framework).trainer_for(ctx.workload.objective)
    if trainer is not None and trainer.config == "torchtitan":
        return _torchtitan_files(ctx)
    return _nemo_rl_files(ctx)
