"""The configurations `perfpredict collect trl` measures: model shapes, trainer/objective/reference combinations and
the sampled grid, in a run order that keeps a partial collection balanced. No torch here (unit-testable).

What TRL 1.16 offers (installed sources, site-packages/trl):
- DPO: trl/trainer/dpo_trainer.py (loss_type list incl. "sigmoid", "ipo": dpo_config.py:245; reference: `ref_model=`
  or `precompute_ref_log_probs=True`: dpo_config.py:227, dpo_trainer.py:907-926; `padding_free` is accepted but
  disabled with a warning: dpo_trainer.py:732-739).
- CPO (SimPO = `loss_type="simpo"`, `cpo_alpha=0`): trl/experimental/cpo/cpo_config.py:121-139, reference-free.
- ORPO: trl/experimental/orpo/orpo_trainer.py, reference-free.
- KTO: promoted to trl/trainer/kto_trainer.py (trl.experimental.kto only re-exports it with a deprecation
  warning); needs per-device batch > 1 for its KL term and sequential sampling (kto_trainer.py:836-846).
- DeepSpeed (backend `deepspeed`): the same trainers with `deepspeed=` a ZeRO config (TrainingArguments'
  HfTrainerDeepSpeedConfig fills the "auto" values); ZeRO stage and world size are config fields (zero_stage,
  ds_world), left out of the key of every other backend so earlier rows keep their run_id."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

# The model shapes live in collect.trl_shapes (collect probes --families trl probes them too).
from perfpredict.collect.trl_shapes import ALL_SHAPES, SHAPES
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec

# (trainer, loss_type, reference): the objectives users run with TRL 1.16.
COMBOS: tuple[tuple[str, str, str], ...] = (
    ("dpo", "sigmoid", "live"), ("cpo", "simpo", "none"), ("dpo", "sigmoid", "precomputed"),
    ("orpo", "orpo", "none"), ("dpo", "ipo", "live"), ("kto", "kto", "live"),
    ("dpo", "ipo", "precomputed"), ("kto", "kto", "precomputed"),
)
OBJECTIVE = {"sigmoid": "dpo", "ipo": "ipo", "simpo": "simpo", "orpo": "orpo", "kto": "kto"}
TRAINERS = ("dpo", "cpo", "orpo", "kto")
BACKENDS = {"single": 1, "ddp": 2, "fsdp": 2, "deepspeed": 1}  # deepspeed: default world (ds_world overrides)
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16")  # bf16: TrainingArguments(bf16=True) over fp32 weights (DeepSpeed: its bf16 block)
ZERO_STAGES = (0, 1, 2, 3)
DS_WORLDS = (1, 2)
SEQ_LENS = (128, 256, 512, 768, 1024)
PROMPT_FRACTIONS = (0.25, 0.5, 0.75)
BATCHES = (1, 2, 4, 8)
ACCUMS = (1, 4)
JITTERS = (0.0, 0.25)
# One fp32 thread: ~30 GFLOP/s on 1024^3 GEMMs on this AMD EPYC while others share the cores; ~20 overall.
EFFECTIVE_FLOPS = 20e9
LOGIT_S = 67e-9  # seconds per logit per pass at vocab 32k (scaled linearly with vocab below it)


@dataclass(frozen=True)
class TrlConfig:
    trainer: str
    loss_type: str
    reference: str
    backend: str
    shape: str
    per_device_batch: int
    grad_accum: int
    checkpointing: bool
    padding_free: bool
    prompt_len: int
    completion_len: int
    len_jitter: float = 0.0
    seed: int = 0
    zero_stage: int = 0  # deepspeed only
    ds_world: int = 1  # deepspeed only: ranks
    device: str = "cpu"  # cuda: a GPU machine (collect.device); left out of the key when cpu, as precision/world
    precision: str = "fp32"
    world_size: int = 0  # ranks of a single/ddp/fsdp launch; 0 = BACKENDS' default (fsdp on one GPU: 1)

    def __post_init__(self) -> None:
        combo = (self.trainer, self.loss_type, self.reference)
        if combo not in COMBOS:
            raise PerfPredictError(f"unsupported trainer/loss/reference {combo}; accepted: {COMBOS}")
        if self.backend not in BACKENDS:
            raise PerfPredictError(f"unknown backend {self.backend!r}; accepted: {', '.join(BACKENDS)}")
        if self.shape not in ALL_SHAPES:
            raise PerfPredictError(f"unknown shape {self.shape!r}; accepted: {', '.join(ALL_SHAPES)}")
        if self.device not in DEVICES or self.precision not in PRECISIONS:
            raise PerfPredictError(f"device must be one of {DEVICES} and precision one of {PRECISIONS}, got "
                                   f"{self.device!r} / {self.precision!r}")
        if self.world_size < 0 or (self.world_size and self.backend == "deepspeed"):
            raise PerfPredictError("world_size is >= 0 and not a deepspeed setting (deepspeed takes ds_world)")
        if self.per_device_batch < 1 or self.grad_accum < 1 or self.prompt_len < 1 or self.completion_len < 1:
            raise PerfPredictError("per_device_batch, grad_accum, prompt_len and completion_len must be >= 1")
        if self.trainer == "kto" and self.per_device_batch < 2:
            raise PerfPredictError("KTO needs per_device_batch >= 2 (its KL term cycles completions in the batch)")
        if self.backend == "deepspeed":
            if self.zero_stage not in ZERO_STAGES or self.ds_world not in DS_WORLDS:
                raise PerfPredictError(f"deepspeed needs zero_stage in {ZERO_STAGES} and ds_world in {DS_WORLDS}, got "
                                       f"{self.zero_stage} and {self.ds_world}")
        elif (self.zero_stage, self.ds_world) != (0, 1):
            raise PerfPredictError(f"zero_stage / ds_world are deepspeed settings; backend {self.backend!r} takes "
                                   "neither")
        if not 0.0 <= self.len_jitter < 1.0:
            raise PerfPredictError(f"len_jitter must be in [0, 1), got {self.len_jitter}")

    @property
    def world(self) -> int:
        return self.ds_world if self.backend == "deepspeed" else (self.world_size or BACKENDS[self.backend])

    @property
    def spec(self) -> ModelSpec:
        return ALL_SHAPES[self.shape]

    @property
    def launch_group(self) -> str:
        """Configs one worker launch may share: same backend, world and (DeepSpeed) ZeRO stage."""
        return f"{self.backend}-z{self.zero_stage}-w{self.ds_world}" if self.backend == "deepspeed" else self.backend

    @property
    def objective(self) -> str:
        return OBJECTIVE[self.loss_type]

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.backend != "deepspeed":  # the keys (run_id) of rows collected before these fields existed
            del d["zero_stage"], d["ds_world"]
        for f, default in (("device", "cpu"), ("precision", "fp32"), ("world_size", 0)):
            if d[f] == default:  # likewise: CPU rows keep their run_id
                del d[f]
        return d

    def key(self, *, warmup: int, steps: int, hardware: str) -> str:
        """The resumability key (= run_id): the config plus what changes the measurement."""
        blob = json.dumps({"cfg": self.to_dict(), "warmup": warmup, "steps": steps, "hardware": hardware},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def rows_per_forward(cfg: TrlConfig) -> int:
    """Sequences in the policy's forwards per micro-batch: chosen+rejected concatenated, or KTO's batch + KL batch."""
    return 2 * cfg.per_device_batch


def estimated_step_s(cfg: TrlConfig) -> float:
    """A rough cost of one optimizer step on one rank (to keep configs short; not a feature)."""
    m = cfg.spec
    tokens = rows_per_forward(cfg) * cfg.seq_len * cfg.grad_accum
    body = m.param_count - 2 * m.vocab * m.hidden
    head = m.vocab * m.hidden
    fwd = 2 * (body + head) * tokens + 4 * m.layers * m.hidden * cfg.seq_len * tokens
    passes = 3.0 + (1.0 if cfg.checkpointing else 0.0) + (1.0 if cfg.reference == "live" else 0.0)
    if cfg.trainer == "kto":
        passes += 0.5  # the KL forward (no grad) on half the rows
    # The vocabulary path (log-softmax, entropy... over tokens x vocab) is memory-bound and was seen far slower
    # per logit at vocab 32k than at 2k (first rows: a 32k-vocab DPO step ~6x its GEMM estimate).
    logits_s = tokens * m.vocab * 3.0 * LOGIT_S * (m.vocab / 32000)
    return fwd * passes / EFFECTIVE_FLOPS + logits_s


def sample_grid(n: int, *, seed: int = 0, backends: tuple[str, ...] = ("single", "ddp", "fsdp"),
                shapes: tuple[str, ...] | None = None, max_step_s: float = 2.5,
                min_seq: int = SEQ_LENS[0], zero_stages: tuple[int, ...] = (1, 2, 3),
                ds_worlds: tuple[int, ...] = (1,)) -> list[TrlConfig]:
    """n configs in run order: shapes, objective combos and backends rotate so any prefix is balanced; sequence
    length, prompt share, checkpointing and jitter are drawn at random (seeded), then batch and accumulation are
    drawn among those whose estimated step cost is under max_step_s (the sequence is shortened if none is, never
    below min_seq: a supplement of long sequences is `min_seq=512`). DeepSpeed configs rotate over zero_stages and
    ds_worlds (by their own count, so the other backends' draws are those of a grid without DeepSpeed)."""
    for b in backends:
        if b not in BACKENDS:
            raise PerfPredictError(f"unknown backend {b!r}; accepted: {', '.join(BACKENDS)}")
    names = tuple(shapes) if shapes else tuple(SHAPES)
    for s in names:
        if s not in SHAPES:
            raise PerfPredictError(f"unknown shape {s!r}; accepted: {', '.join(SHAPES)}")
    for z in zero_stages:
        if z not in ZERO_STAGES:
            raise PerfPredictError(f"unknown ZeRO stage {z}; accepted: {ZERO_STAGES}")
    for w in ds_worlds:
        if w not in DS_WORLDS:
            raise PerfPredictError(f"unsupported DeepSpeed world size {w}; accepted: {DS_WORLDS}")
    if not zero_stages or not ds_worlds:
        raise PerfPredictError("zero_stages and ds_worlds need at least one value each")
    if min_seq not in SEQ_LENS:
        raise PerfPredictError(f"min_seq must be one of {SEQ_LENS}, got {min_seq}")
    floor = SEQ_LENS.index(min_seq)
    rng = random.Random(seed)
    out: list[TrlConfig] = []
    seen: set[TrlConfig] = set()
    i = ds = 0
    while len(out) < n and i < 20 * n + 100:
        shape = names[i % len(names)]
        # shape and combo counts are coprime (7, 8): every pair comes up once in 56 slots; the backend shifts
        # by one every 8 slots, so each (combo, backend) pair comes up every 16 (with 2 backends).
        trainer, loss, ref = COMBOS[i % len(COMBOS)]
        backend = backends[(i + i // len(COMBOS)) % len(backends)]
        i += 1
        zero, dsw = 0, 1
        if backend == "deepspeed":
            # stage shifts by one every len(COMBOS) DeepSpeed slots, so each (combo, stage) pair comes up
            zero = zero_stages[(ds + ds // len(COMBOS)) % len(zero_stages)]
            dsw = ds_worlds[(ds // len(zero_stages)) % len(ds_worlds)]
            ds += 1
        ckpt, jitter = rng.random() < 0.5, rng.choice(JITTERS)
        pfree = trainer == "dpo" and rng.random() < 0.15
        frac = rng.choice(PROMPT_FRACTIONS)
        batches = BATCHES[1:] if trainer == "kto" else BATCHES
        # Draw every knob, then shrink a randomly chosen one until the config is under the cost cap, so long
        # sequences, big batches and accumulation each keep a share instead of the cap always cutting the same one.
        knobs = {"seq": SEQ_LENS.index(rng.choice(SEQ_LENS[floor:])), "batch": rng.randrange(len(batches)),
                 "accum": rng.randrange(len(ACCUMS))}

        def make(k: dict[str, int]) -> TrlConfig:
            seq = SEQ_LENS[k["seq"]]
            prompt = max(8, int(seq * frac))  # noqa: B023 - used at once, inside this iteration
            return TrlConfig(trainer=trainer, loss_type=loss, reference=ref, backend=backend,  # noqa: B023
                             shape=shape, per_device_batch=batches[k["batch"]],  # noqa: B023
                             grad_accum=ACCUMS[k["accum"]], checkpointing=ckpt, padding_free=pfree,  # noqa: B023
                             prompt_len=prompt, completion_len=seq - prompt, len_jitter=jitter, seed=seed,  # noqa: B023
                             zero_stage=zero, ds_world=dsw)  # noqa: B023

        # Every few slots one knob is held high (accumulation 4, batch >= 4, sequence >= 512) and the others give
        # way, at up to twice the cap: without it the cap would leave these corners nearly empty on a slow CPU.
        held = ("accum", "batch", "seq", None, None)[i % 5]
        if held:
            knobs[held] = {"accum": 1, "batch": len(batches) - 2, "seq": max(2, floor)}[held] + (
                rng.randrange(2) if held != "accum" else 0)
        cap = 2 * max_step_s if held else max_step_s
        cfg = make(knobs)
        lowest = {"seq": floor, "batch": 0, "accum": 0}
        while estimated_step_s(cfg) > cap and any(v > lowest[k] for k, v in knobs.items() if k != held):
            knob = rng.choice([k for k, v in knobs.items() if v > lowest[k] and k != held])
            knobs[knob] -= 1
            cfg = make(knobs)
        if cfg in seen or estimated_step_s(cfg) > 3 * max_step_s:
            continue
        seen.add(cfg)
        out.append(cfg)
    return out


def chunks(configs: list[TrlConfig], size: int) -> list[tuple[str, list[TrlConfig]]]:
    """Consecutive runs of configs of one launch group (backend; DeepSpeed: + stage and world), at most `size` long,
    in the configs' order (one worker launch each): launching costs seconds, so a launch measures several configs;
    short chunks keep the order mixed. DeepSpeed: one config per launch. A finished DeepSpeed trainer's engine and
    ZeRO optimizer stay reachable in the process (measured: the live tensors at a later config's step begin grew by
    16 B per parameter per earlier config: its fp32 master partition and Adam states), which would count in the
    next config's peak; accelerate's state also keeps the first DeepSpeed plugin."""
    out: list[tuple[str, list[TrlConfig]]] = []
    pending: dict[str, list[TrlConfig]] = {}
    for c in configs:
        group = pending.setdefault(c.launch_group, [])
        group.append(c)
        if len(group) >= (1 if c.backend == "deepspeed" else size):
            out.append((c.launch_group, group))
            pending[c.launch_group] = []
    out.extend((b, g) for b, g in pending.items() if g)
    return out
