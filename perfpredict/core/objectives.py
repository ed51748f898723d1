"""What each training objective is: the one table the workload, the descriptors, emit and the CLI read.

Pretraining and SFT run one sequence per sample with a plain causal-LM loss. DPO and IPO compare the policy with a
frozen reference on chosen/rejected pairs; SimPO and ORPO are reference-free by design. KTO (TRL's KTOTrainer)
learns from unpaired examples: a sample is one completion, but it needs a reference like DPO. Preference objectives
run chosen and rejected through the policy as one concatenated batch (TRL's concatenated_forward), two sequences
per sample.

TRL 1.16 runs them as DPOTrainer (loss_type sigmoid / ipo), the experimental CPOTrainer (SimPO: loss_type simpo with
cpo_alpha 0) and ORPOTrainer, and KTOTrainer; NeMo-Aligner's Megatron DPO trainer has preference_loss dpo and ipo
(and rpo variants), no SimPO, ORPO or KTO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfpredict.core.errors import PerfPredictError


@dataclass(frozen=True)
class Objective:
    name: str
    is_preference: bool  # samples are chosen/rejected pairs, both through the policy
    needs_reference: bool  # compares the policy with a frozen reference model
    # How TRL (or transformers, for pretraining) runs it: the script, the config class it parses, the args file
    # `--emit trl` writes (None: no TRL trainer config), the trainer class the descriptors model.
    trl_script: str
    trl_config: str
    trl_args_file: str | None = None
    trl_trainer: str | None = None
    trl_loss_type: str | None = None  # the config's loss_type (None: the trainer has none to set)
    trl_beta: float | None = None  # the beta written to the trainer config (None: not set)
    trl_beta_means: str = ""  # what beta is for this loss when it is not DPO's beta (messages)
    trl_extra_args: tuple[tuple[str, object], ...] = ()  # further trainer-config fields, in order
    trl_notes: tuple[str, ...] = field(default=())  # emitted beside its trainer config
    nemo_aligner_loss: str | None = None  # NeMo-Aligner's model.dpo.preference_loss (None: it has no such loss)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise PerfPredictError(f"objective name must be a non-empty string, got {self.name!r}")
        if self.trl_args_file is not None and self.trl_trainer is None:
            raise PerfPredictError(f"objective {self.name}: a TRL args file needs a TRL trainer")

    @property
    def seqs_per_sample(self) -> int:
        """Chosen and rejected run through the policy as one concatenated batch (TRL's concatenated_forward)."""
        return 2 if self.is_preference else 1

    @property
    def default_reference(self) -> str:
        """The reference handling a workload gets when it names none: live if it needs one, else none."""
        return "live" if self.needs_reference else "none"


_DPO = dict(trl_script="$TRL_DIR/trl/scripts/dpo.py", trl_config="trl.DPOConfig", trl_args_file="trl_dpo_args.json",
            trl_trainer="DPOTrainer", trl_beta=0.1)

OBJECTIVE_TABLE: dict[str, Objective] = {o.name: o for o in [
    Objective("pretrain", is_preference=False, needs_reference=False,
              trl_script="$TRANSFORMERS_DIR/examples/pytorch/language-modeling/run_clm.py",
              trl_config="transformers.TrainingArguments"),
    Objective("sft", is_preference=False, needs_reference=False, trl_script="$TRL_DIR/trl/scripts/sft.py",
              trl_config="trl.SFTConfig"),
    Objective("dpo", is_preference=True, needs_reference=True, **_DPO, trl_loss_type="sigmoid",
              nemo_aligner_loss="dpo"),
    Objective("ipo", is_preference=True, needs_reference=True, **_DPO, trl_loss_type="ipo", trl_beta_means="IPO's tau",
              nemo_aligner_loss="ipo"),
    Objective("simpo", is_preference=True, needs_reference=False, trl_script="$TRL_DIR/trl/experimental/cpo/cpo.py",
              trl_config="trl.experimental.cpo.CPOConfig", trl_args_file="trl_cpo_args.json", trl_trainer="CPOTrainer",
              trl_loss_type="simpo", trl_extra_args=(("cpo_alpha", 0.0),),
              trl_notes=("SimPO runs as TRL's CPOTrainer with loss_type simpo and cpo_alpha 0 (a non-zero cpo_alpha is "
                         "CPO-SimPO); tune beta and simpo_gamma for SimPO, whose good values differ from DPO's.",)),
    Objective("orpo", is_preference=True, needs_reference=False, trl_script="$TRL_DIR/trl/experimental/orpo/orpo.py",
              trl_config="trl.experimental.orpo.ORPOConfig", trl_args_file="trl_orpo_args.json",
              trl_trainer="ORPOTrainer", trl_beta=0.1),
    Objective("kto", is_preference=False, needs_reference=True, trl_script="$TRL_DIR/trl/scripts/kto.py",
              trl_config="trl.KTOConfig", trl_args_file="trl_kto_args.json", trl_trainer="KTOTrainer",
              trl_loss_type="kto", trl_beta=0.1,
              trl_notes=("KTO (trl.KTOTrainer) takes unpaired examples: per_device_train_batch_size counts completions; "
                         "each step also runs a mismatched KL batch of the same size through the policy and reference.",)),
]}
OBJECTIVES = tuple(OBJECTIVE_TABLE)
PREFERENCE = frozenset(n for n, o in OBJECTIVE_TABLE.items() if o.is_preference)
# Objectives a TRL trainer runs (features.trl models their trainers).
TRL_OBJECTIVES = tuple(n for n, o in OBJECTIVE_TABLE.items() if o.trl_trainer)


def objective(name: str) -> Objective:
    if name not in OBJECTIVE_TABLE:
        raise PerfPredictError(f"unknown objective {name!r}; accepted: {', '.join(OBJECTIVES)}")
    return OBJECTIVE_TABLE[name]


def sequences_per_sample(name: str) -> int:
    """Sequences per sample through the policy (unknown names count one, as plain causal-LM samples)."""
    o = OBJECTIVE_TABLE.get(name)
    return o.seqs_per_sample if o else 1
