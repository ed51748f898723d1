#!/usr/bin/env bash
# The wheels the H200 session (benchmarks/device/h200_session.sh) needs beside what the lent machine has
# (/work/.library/device/KINDS.md: python 3.12, torch 2.11+cu130, transformers 5.17, accelerate 1.15, peft; no
# trl, datasets or deepspeed; nothing can be fetched there). Run here, in the repo root, before the `run` call;
# `.whl/` is git-ignored and travels through `carry`. Sizes (2026-12-03): ~7 MiB in all, beside a ~25 MiB tree.
#
#   trl 1.16.0 (needs transformers>=4.56.2: 5.17 qualifies; accelerate>=1.10.1: 1.15 qualifies)   0.9 MiB
#   datasets 5.2.0 + dill 0.4.1 + multiprocess 0.70.19 (not on the machine; xxhash, pyarrow, pandas are)   0.9 MiB
#   deepspeed 0.19.8: PyPI has only an sdist; built here into a pure-python wheel with DS_BUILD_OPS=0 (no op is
#     compiled ahead; ZeRO-2/3 with the Trainer's torch AdamW needs none, anything else JIT-builds there with
#     the machine's ninja and nvcc 13.0)   2.1 MiB
#   hjson, pydantic 2.14.4 + pydantic-core 2.50.5 + annotated-types + typing-inspection + typing_extensions
#     (DeepSpeed's needs missing there; ninja, py-cpuinfo, msgpack, nvidia-ml-py, einops, psutil are there)   2.9 MiB
#
# Not carried: polars (its runtime wheel is 54 MiB: with the tree it exceeds the 64 MiB a call carries), so the
# session is polars-free and `perfpredict collect import-device` writes the parquet here. vLLM: its wheel is
# 239 MiB (vllm 0.34.0, manylinux_2_28, without its dependencies): it cannot travel, see docs/collecting.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
P=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: "${P[@]}" -d .whl \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0
if [ ! -f .whl/deepspeed-0.19.8-py3-none-any.whl ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" deepspeed==0.19.8
  # --no-build-isolation: setup.py imports torch (the local CPU build is enough to write a pure-python wheel).
  DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "$tmp"/deepspeed-0.19.8.tar.gz
  rm -rf "$tmp"
fi
du -ch .whl/*.whl | tail -1
# What a `run` call carries: tracked + untracked-not-ignored files + .whl, against its 64 MiB.
python3 - <<'PY'
import os, subprocess
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, text=True).stdout
tree = sum(os.path.getsize(f) for f in files.split("\0") if f and os.path.isfile(f))
whl = sum(os.path.getsize(os.path.join(".whl", f)) for f in os.listdir(".whl"))
print(f"tree {tree / 2**20:.1f} MiB + .whl {whl / 2**20:.1f} MiB = {(tree + whl) / 2**20:.1f} MiB of 64")
PY
