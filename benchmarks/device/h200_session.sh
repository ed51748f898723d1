#!/usr/bin/env bash
# One lent H200 (the `device` tool: 15 minutes of device time per task, this script ~8 of them), run from the repo
# root there. Writes under $OUT (at most 8 files come back; this writes 7):
#   env.txt       nvidia-smi, python and package versions, what imported
#   session.log   the session's progress
#   meta.json     the measuring machine's facts (fingerprint, versions, date) and the command
#   probes.jsonl  `collect probes --quick` rows on the GPU (gemm, attention, memory) + the decode family
#   probes-trl.jsonl  the TRL-op probes (collect probes --families trl)
#   trl.jsonl     the TRL DPO step grid: plain / FSDP2 (one-rank torchrun) / DeepSpeed ZeRO-2 and ZeRO-3,
#                 checkpointing off/on, reference live/precomputed, step time and torch.cuda.max_memory_allocated
#   summary.json  what ran and what was skipped, with the reason
# Each part has its budget (H200_PROBES_S, H200_TRL_S) and the whole session a hard `timeout` (H200_TOTAL_S), and
# every file is appended line by line, so a session cut short still returns what it measured.
# Then, here: perfpredict collect import-device <files_at> (docs/collecting.md, "When a device is lent").
#
# Dry run on this machine's CPU (tiny model, seconds per config; DeepSpeed only if importable):
#   H200_DRY_RUN=1 OUT=/tmp/h200-dry bash benchmarks/device/h200_session.sh
set -u
: "${OUT:?OUT must name the output folder (the device tool sets it)}"
DRY=${H200_DRY_RUN:-0}
TOTAL_S=${H200_TOTAL_S:-480}
PROBES_S=${H200_PROBES_S:-120}
TRL_S=${H200_TRL_S:-310}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
# Wheels travelled in .whl (benchmarks/device/fetch_wheels.sh): installed into a folder that shadows the image's.
if [ "$DRY" != "1" ] && compgen -G ".whl/*.whl" > /dev/null; then  # a dry run uses this machine's packages
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# DeepSpeed's wheel has no op compiled (DS_BUILD_OPS=0): if one is ever JIT-built, for Hopper, and without its
# check of nvcc against torch's CUDA (13.0 both there, per KINDS.md).
export TORCH_CUDA_ARCH_LIST=9.0 DS_SKIP_CUDA_CHECK=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 | head -3
  "$PY" -V
  "$PY" - <<'PY'
import importlib
for m in ("torch", "transformers", "accelerate", "trl", "datasets", "deepspeed", "peft", "polars"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
    except Exception as e:  # noqa: BLE001
        print(m, "NOT IMPORTABLE:", type(e).__name__, str(e)[:200])
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.device_count())
PY
} > "$OUT/env.txt" 2>&1
args=(--out "$OUT" --probes-s "$PROBES_S" --trl-s "$TRL_S")
[ "$DRY" = "1" ] && args+=(--dry-run)
[ -n "${H200_SESSION_ARGS:-}" ] && read -r -a extra <<< "$H200_SESSION_ARGS" && args+=("${extra[@]}")
left=$(( TOTAL_S - ($(date +%s) - t0) ))
timeout -k 15 "$left" "$PY" -m perfpredict.collect.device.session "${args[@]}" 2>&1 \
  | grep --line-buffered -v '^USDT' | tee "$OUT/session.log"
rc=${PIPESTATUS[0]}
echo "session exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/session.log"
ls -la "$OUT"
exit 0
