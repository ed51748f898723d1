"""NeMo AutoModel's performance summary (FSDP2 on H100, BF16): the dense full-parameter row (transcribed)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="nemo_automodel", repo="NVIDIA-NeMo/Automodel",
                    commit="cb9765441e5127b8100879ca1f7ff5920f825887", date="2026-06-12", license="Apache-2.0",
                    software={"framework": "NeMo AutoModel (PyTorch FSDP2)", "dtype": "bf16"})

SECTION = """\
# NeMo AutoModel performance summary (DGX-H100, BF16)

What: NVIDIA NeMo AutoModel (PyTorch-native FSDP2 training of Hugging Face models) publishes a performance summary
of benchmark runs on DGX-H100 in BF16: `docs/performance-summary.mdx` in github.com/NVIDIA-NeMo/Automodel, read at
commit cb9765441e5127b8100879ca1f7ff5920f825887 (2026-06-12; the file is unchanged at the mirror's HEAD
36044ad3d139363fb6c73c24af2e7c6b65ec52f6). Columns: #GPUs, GBS, MBS, LBS (local batch), GA, Seq Length, TP, PP, CP,
EP, VP, FSDP (sharding group size), kernel optimizations, time per global step (s), model TFLOP/s/GPU, tokens/s/GPU.
The page notes: mock data, no gradient clipping, step time includes forward, backward and the optimizer step of the
global batch. License: Apache-2.0. Transcribed by hand into `transcribed.csv`; imported by
`perfpredict.importers.nemo_automodel` into `runs.parquet`.

## The imported row

`Llama3 70B`, 64 GPUs (8 nodes of 8 H100), GBS 128, MBS = LBS 1, GA 4, sequence 8192, TP 1, PP 1, CP 2, FSDP 32:
18.90 s per global step, 389 TFLOP/s/GPU, 866.77 tokens/s/GPU (128 x 8192 / 18.90 / 64 = 866.8: the three agree).
Its recipe (`examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml`) runs
meta-llama/Llama-3.1-70B (catalog `llama-3.1-70b`) with `strategy: fsdp2`, `reshard_after_forward: True` (zero 3),
`activation_checkpointing: True` (recompute `full`), `cp_size: 2`, dp = 64 / cp = 32, TE's FusedAdam,
`enable_compile: True`, `enable_fsdp2_prefetch: True`, SDPA attention. Plan: framework `fsdp2` (the capability
table's FSDP2 + DTensor runtime: fully_shard per block, as NeMo AutoModel's FSDP2 manager applies it), zero 3,
dp 32, cp 2, micro_batch 1, grad_accum 4, objective `pretrain` (the recipe is next-token prediction on mock data; the
step is the same as full-parameter SFT of unpacked full-length sequences). No memory is published.

Caveats: the capability table's fsdp2 runtime has no context parallelism yet; the row's `note` carries the refusal,
and the plan is kept as it ran. torch.compile and TE kernels make this faster
than an eager FSDP2 step.

## Not imported

The fine-tuning rows of the page are LoRA (the plan schema trains all parameters; there is no adapter plan), and
the MoE pretraining rows use models outside the catalog with expert parallelism inside FSDP2: listed below.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="nemo_automodel", section=SECTION)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
