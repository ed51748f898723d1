"""torchrun target: launch.sh, which runs the other targets' files on every node."""

from __future__ import annotations

import shlex

from perfpredict.core.frameworks import CAPABILITIES, runtime_of
from perfpredict.predictor.emit.common import RDZV_PORT, Ctx, comment_block
from perfpredict.predictor.emit.deepspeed import deepspeed_files
from perfpredict.predictor.emit.fsdp import fsdp_files
from perfpredict.predictor.emit.fsdp2 import fsdp2_files
from perfpredict.predictor.emit.megatron import megatron_files, megatron_tokens, nemo_aligner_overrides
from perfpredict.predictor.emit.trl import accelerate_launch, trainer, trainer_notes, trl_files


def _shell_word(tok: str) -> str:
    """Quote for bash, keeping $VAR expansions live (double quotes) where the token uses them."""
    if "$" in tok:
        return '"' + tok.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
    return shlex.quote(tok)


def _command_text(cmd: list[str]) -> str:
    """One flag (and its value) per continued line."""
    i = 1
    while i < len(cmd) and not cmd[i].startswith("-"):  # "accelerate launch"
        i += 1
    parts: list[list[str]] = [cmd[:i]]
    while i < len(cmd):
        tok = cmd[i]
        if tok.startswith("-") and i + 1 < len(cmd) and not cmd[i + 1].startswith("--"):
            parts.append([tok, cmd[i + 1]])
            i += 2
        else:
            parts.append([tok])
            i += 1
    lines = [" ".join(_shell_word(t) for t in grp) for grp in parts]
    return " \\\n  ".join(lines) + "\n"


def torchrun_files(ctx: Ctx) -> dict[str, str]:
    p, w, c = ctx.plan, ctx.workload, ctx.cluster
    files: dict[str, str] = {}
    env = ['NODE_RANK="${NODE_RANK:-0}"',
           'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"' if c.nodes == 1 else
           ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the node with NODE_RANK=0}"']
    notes: list[str] = []
    cap = CAPABILITIES[p.framework]
    if cap.emit_target == "fsdp2":  # torchtitan's run_train.sh / NeMo-RL's uv run: its own launch.sh
        return fsdp2_files(ctx)
    if cap.launcher == "torchrun":
        torchrun = ["torchrun", "--nnodes", str(c.nodes), "--nproc-per-node", str(c.gpus_per_node),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$MASTER_ADDR:{RDZV_PORT}",
                    "--rdzv-id", "$RDZV_ID"]
        env.append('RDZV_ID="${RDZV_ID:-perfpredict}"')
        files.update(megatron_files(ctx))
        if w.is_preference:
            env.append('NEMO_ALIGNER_DIR="${NEMO_ALIGNER_DIR:-/opt/NeMo-Aligner}"')
            env += [': "${NEMO_CHECKPOINT:?set NEMO_CHECKPOINT to the .nemo policy checkpoint}"',
                    ': "${TRAIN_DATA:?set TRAIN_DATA to the train jsonl (prompt, chosen_response, rejected_response)}"',
                    ': "${VALID_DATA:?set VALID_DATA to the validation jsonl}"']
            cmd = torchrun + ["$NEMO_ALIGNER_DIR/examples/nlp/gpt/train_gpt_dpo.py"] + nemo_aligner_overrides(ctx)
            notes += [f"NeMo-Aligner {w.objective.upper()} under torchrun; its micro/global batch sizes count pairs "
                      "(megatron_args.txt lists the same layout in sequences).",
                      "The model shape comes from the .nemo checkpoint; megatron_args.txt documents it.",
                      "NeMo-Aligner keeps the reference weights on CPU and swaps them in per global batch "
                      f"(plan reference: {w.reference})."]
        else:
            env.append('MEGATRON_LM_DIR="${MEGATRON_LM_DIR:-/opt/Megatron-LM}"')
            cmd = torchrun + ["$MEGATRON_LM_DIR/pretrain_gpt.py"] + megatron_tokens(ctx)
            notes += ["Megatron-LM pretrain_gpt.py with the arguments of megatron_args.txt; extra arguments to this",
                      "script (--data-path ..., --lr, --train-iters, --save, --load) are passed through."]
            if w.objective == "sft":
                notes.append("pretrain_gpt.py is a pretraining loop: for SFT use the same layout in your SFT "
                             "trainer (NeMo / Megatron-Bridge).")
            cmd.append("$@")
    else:
        config_file = runtime_of(p.framework).accelerate_config_file
        # The accelerate config its own emit target writes (trl+deepspeed: the deepspeed target's).
        builders = {"deepspeed": deepspeed_files, "fsdp": fsdp_files, "trl": trl_files}
        files.update(builders[cap.emit_target](ctx))
        if w.objective == "pretrain":
            env.append('TRANSFORMERS_DIR="${TRANSFORMERS_DIR:-$PWD/transformers}"')
        else:
            env.append('TRL_DIR="${TRL_DIR:-$PWD/trl}"')
        env.append(': "${DATASET_NAME:?set DATASET_NAME (a Hub dataset id or local path)}"')
        cmd = accelerate_launch(ctx, config_file)
        notes += [f"accelerate launch starts {c.gpus_per_node} processes on each of {c.nodes} node(s) through "
                  "torch.distributed.run; run this script once per node with NODE_RANK set.",
                  f"{trainer(ctx)['script']} runs the {w.objective} objective."]
        notes += trainer_notes(ctx)
        cmd.append("$@")
    text = "#!/usr/bin/env bash\n" + comment_block(ctx.header + [""] + notes)
    text += "set -euo pipefail\n" + "\n".join(env) + "\n\n" + _command_text(cmd)
    files["launch.sh"] = text
    return files
