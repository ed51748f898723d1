"""Training objectives as TRL computes them, on synthetic token batches.

Preference objectives (dpo, ipo, simpo, orpo) run chosen and rejected through the policy as ONE batch of 2*B
sequences (TRL DPOTrainer.concatenated_forward), take per-sequence sums of token log-probs over the response from an
fp32 log-softmax of the logits, and combine them with the reference's log-probs:
- reference "live": a frozen reference model's forward under no_grad, on the same concatenated batch;
- "precomputed": reference log-probs computed offline and shipped with the batch (TRL precompute_ref_log_probs);
- "none": reference-free objectives (simpo, orpo).
sft is cross-entropy on response tokens, pretrain on all tokens.

Row layout of a preference batch: "concat" puts the B chosen rows first, then the B rejected rows (TRL);
"interleave" alternates them (c0, r0, c1, r1, ...) so that cutting the batch into pipeline micro-batches along dim 0
keeps whole pairs together. The cost of the step is the same; only the split differs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.workload import PREFERENCE, Workload, sequences_per_sample

IGNORE = -100
MEASURED_REFERENCES = ("live", "precomputed", "none")  # no offloaded reference in the harness


@dataclass(frozen=True)
class Objective:
    name: str = "dpo"
    reference: str = "live"  # live | precomputed | none
    beta: float = 0.1
    simpo_gamma: float = 0.5
    orpo_lambda: float = 0.1
    layout: str = "concat"  # concat | interleave

    def __post_init__(self) -> None:
        Workload(objective=self.name, reference=self.reference)  # core's rules: known objective, valid pairing
        if self.reference not in MEASURED_REFERENCES:
            raise PerfPredictError(f"collect measures reference live, precomputed or none, not {self.reference!r}")
        if self.layout not in ("concat", "interleave"):
            raise PerfPredictError(f"unknown layout {self.layout!r}")

    @property
    def preference(self) -> bool:
        return self.name in PREFERENCE

    @property
    def seqs_per_sample(self) -> int:
        return sequences_per_sample(self.name)


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (rows, T) int64
    labels: torch.Tensor  # (rows, T) int64, IGNORE where no loss; labels[t] is the token after position t
    ref_logps: torch.Tensor | None  # (rows,) fp32 for reference="precomputed", else None

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


def make_samples(obj: Objective, *, samples: int, seq_len: int, vocab: int, seed: int) -> Batch:
    """`samples` pairs (or sequences), generated from a fixed seed so every rank sees the same global batch.

    Returned in sample-major order (pair p's chosen then rejected at rows 2p, 2p+1) as the source that
    `select` cuts micro-batches from. Preference pairs share the prompt (first half), differ in the response."""
    g = torch.Generator().manual_seed(seed + 7919)
    T = seq_len
    prompt = max(1, T // 2) if obj.name != "pretrain" else 0
    ids = torch.randint(0, vocab, (samples, obj.seqs_per_sample, T), generator=g)
    if obj.preference:
        ids[:, 1, :prompt] = ids[:, 0, :prompt]
    ids = ids.reshape(samples * obj.seqs_per_sample, T)
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    if prompt:
        labels[:, : prompt - 1] = IGNORE
    ref = None
    if obj.reference == "precomputed":
        # Plausible sums of log-probs of random tokens: about -log(V) per response token, with some spread.
        n = (labels != IGNORE).sum(-1).float()
        ref = -n * math.log(vocab) + torch.randn(ids.shape[0], generator=g)
    return Batch(ids, labels, ref)


def select(obj: Objective, src: Batch, samples: range | list[int]) -> Batch:
    """Rows of the given samples, in the objective's layout."""
    s = list(samples)
    k = obj.seqs_per_sample
    if k == 1 or obj.layout == "interleave":
        rows = [p * k + j for p in s for j in range(k)]
    else:
        rows = [p * k for p in s] + [p * k + 1 for p in s]
    idx = torch.tensor(rows, dtype=torch.long)
    return Batch(src.input_ids[idx], src.labels[idx], None if src.ref_logps is None else src.ref_logps[idx])


def to_device(b: Batch, device: torch.device | str) -> Batch:
    return Batch(b.input_ids.to(device), b.labels.to(device), None if b.ref_logps is None else b.ref_logps.to(device))


# --- losses -----------------------------------------------------------------------------------------------------
def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sum of response-token log-probs and the number of response tokens, from an fp32 log-softmax over
    the full vocabulary (what TRL materialises: a (rows, T, V) fp32 tensor, a large share of the step's memory)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    mask = labels != IGNORE
    tok = torch.gather(logp, -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (tok * mask).sum(-1), mask.sum(-1)


def _pairs(obj: Objective, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if obj.layout == "interleave":
        return x[0::2], x[1::2]
    half = x.shape[0] // 2
    return x[:half], x[half:]


def preference_loss(obj: Objective, logps: torch.Tensor, counts: torch.Tensor,
                    ref_logps: torch.Tensor | None) -> torch.Tensor:
    pc, pr = _pairs(obj, logps)
    if obj.name in ("dpo", "ipo"):
        if ref_logps is None:
            raise PerfPredictError(f"{obj.name} needs reference log-probs")
        rc, rr = _pairs(obj, ref_logps.to(logps.dtype))
        margin = (pc - rc) - (pr - rr)
        if obj.name == "dpo":
            return -F.logsigmoid(obj.beta * margin).mean()
        return ((margin - 1.0 / (2.0 * obj.beta)) ** 2).mean()
    nc, nr = _pairs(obj, counts.clamp(min=1).to(logps.dtype))
    if obj.name == "simpo":
        return -F.logsigmoid(obj.beta * (pc / nc - pr / nr) - obj.simpo_gamma).mean()
    # orpo: NLL of chosen plus the log odds-ratio term, both on length-normalised log-probs.
    mc, mr = pc / nc, pr / nr
    log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc).clamp(max=1 - 1e-6))
                            - torch.log1p(-torch.exp(mr).clamp(max=1 - 1e-6)))
    return (-mc - obj.orpo_lambda * F.logsigmoid(log_odds)).mean()


def token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def loss_from_logits(obj: Objective, logits: torch.Tensor, labels: torch.Tensor,
                     ref_logps: torch.Tensor | None) -> torch.Tensor:
    if not obj.preference:
        return token_ce(logits, labels)
    logps, counts = sequence_logps(logits, labels)
    return preference_loss(obj, logps, counts, ref_logps)


def compute_loss(obj: Objective, policy: torch.nn.Module, reference: torch.nn.Module | None,
                 batch: Batch) -> torch.Tensor:
    """One micro-batch, no pipeline: the concatenated policy forward, the reference as the objective asks."""
    ref = batch.ref_logps
    if obj.reference == "live":
        if reference is None:
            raise PerfPredictError("reference='live' needs a reference model")
        with torch.no_grad():
            ref, _ = sequence_logps(reference(batch.input_ids), batch.labels)
    logits = policy(batch.input_ids)
    return loss_from_logits(obj, logits, batch.labels, ref)


# --- pipeline packing: the schedule's loss_fn gets (output, target) only ---------------------------------------
def pack_target(labels: torch.Tensor, ref_logps: torch.Tensor | None) -> torch.Tensor:
    """(rows, T+1) fp32: the labels (token ids < 2^24 are exact in fp32) and one column of reference log-probs."""
    ref = ref_logps if ref_logps is not None else torch.zeros(labels.shape[0], device=labels.device)
    return torch.cat([labels.float(), ref.float().unsqueeze(-1)], dim=-1)


def unpack_target(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return target[:, :-1].long(), target[:, -1]


def packed_loss(obj: Objective, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    labels, ref = unpack_target(target)
    return loss_from_logits(obj, logits, labels, ref if obj.reference != "none" else None)
