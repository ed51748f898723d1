"""Offline inputs of a TRL run: a WordLevel tokenizer (one whitespace-separated word = one token, so the text
lengths are the token lengths), random-weight Llama models and in-memory datasets of controlled lengths.

TRL joins prompt and completion as strings (prompt + completion, dpo_trainer.py:1075-1100 tokenize_fn), so every
completion starts with a space: otherwise the prompt's last word and the completion's first merge into an unknown
word and TRL warns that the prompt is not a prefix. TRL appends EOS to completions (dpo_trainer.py:1062 add_eos);
CPO/ORPO also prepend BOS to the prompt (cpo_trainer.py:476 tokenize_row): the measured lengths say what ran."""

from __future__ import annotations

import random
from typing import Any

from perfpredict.collect.trl.grid import ALL_SHAPES, TrlConfig

SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]")


def tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab - len(SPECIALS))}
    words.update({s: vocab - len(SPECIALS) + j for j, s in enumerate(SPECIALS)})
    tk = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                  unk_token="[UNK]")
    tok.padding_side = "left"  # TRL's documented requirement for DPO's processing class (dpo_trainer.py:466)
    return tok


def llama_config(shape: str, tok: Any) -> Any:
    from transformers import LlamaConfig

    m = ALL_SHAPES[shape]
    return LlamaConfig(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.ffn, num_hidden_layers=m.layers,
                       num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
                       max_position_embeddings=2048, tie_word_embeddings=m.tied_embeddings,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


def llama(shape: str, tok: Any, seed: int, device: str = "cpu") -> Any:
    """fp32 weights (bf16 runs cast in the trainer: TrainingArguments(bf16=True) / DeepSpeed's bf16 block), built
    on the device they train on (a 1B model's random init takes seconds on one CPU thread, milliseconds on a GPU)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape, tok))
    return model.to(torch.float32)


def _length(rng: random.Random, nominal: int, jitter: float) -> int:
    lo = max(1, int(round(nominal * (1.0 - jitter))))
    return rng.randint(lo, nominal) if lo < nominal else nominal


def _words(rng: random.Random, n: int, vocab: int) -> str:
    top = vocab - len(SPECIALS)
    return " ".join(f"w{rng.randrange(top)}" for _ in range(n))


def examples_needed(cfg: TrlConfig, steps: int) -> int:
    return steps * cfg.per_device_batch * cfg.grad_accum * cfg.world


def dataset(cfg: TrlConfig, n: int) -> Any:
    """n examples: prompt/chosen/rejected (pairs) or prompt/completion/label (KTO, half desirable)."""
    from datasets import Dataset

    vocab = cfg.spec.vocab
    rng = random.Random(cfg.seed * 7919 + n)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        prompt = _words(rng, _length(rng, cfg.prompt_len, cfg.len_jitter), vocab)
        if cfg.trainer == "kto":
            completion = " " + _words(rng, _length(rng, cfg.completion_len, cfg.len_jitter), vocab)
            rows.append({"prompt": prompt, "completion": completion, "label": i % 2 == 0})
        else:
            chosen = " " + _words(rng, _length(rng, cfg.completion_len, cfg.len_jitter), vocab)
            rejected = " " + _words(rng, _length(rng, cfg.completion_len, cfg.len_jitter), vocab)
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return Dataset.from_list(rows)
