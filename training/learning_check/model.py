"""The learning check's own model: a byte-level BPE tokenizer trained offline on the corpus, and a Llama-style
causal LM built from a config (no pretrained weights: none can be had offline on the GPU machine).

Why byte-level BPE with a few thousand tokens: any text, a kernel the policy invents included, round-trips
exactly (bytes never go unknown), and a vocabulary fitted to our prompts and programs keeps them short
(about 3.5 characters a token), so prompt and answer fit a small model's context. The chat template is plain
role markers; TRL and ``evaluate-model`` render prompts through it, so the model sees the same text in
supervision, in GRPO and in evaluation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAD, EOS = "<|pad|>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, EOS, *ROLE_TOKENS)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@dataclass(frozen=True)
class ModelSize:
    """A Llama shape; ``parameters`` is filled in by :func:`count_parameters` at build time."""

    hidden: int
    layers: int
    heads: int
    intermediate: int


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=64, layers=2, heads=4, intermediate=128),  # tests: well under a million weights
    "small": ModelSize(hidden=512, layers=8, heads=8, intermediate=1408),  # ~30M at a 4096 vocabulary
    "medium": ModelSize(hidden=640, layers=10, heads=10, intermediate=1792),  # ~56M
    "base": ModelSize(hidden=768, layers=12, heads=12, intermediate=2048),  # ~91M
}


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer fitted to ``texts``, with our special tokens and chat template, as a
    ``PreTrainedTokenizerFast`` (so ``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round-trip it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                        additional_special_tokens=list(ROLE_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # generation pads on the left; the SFT collator pads itself
    return tokenizer


def build_model(size: str | ModelSize, tokenizer: Any, max_positions: int = 4096) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` of ``size`` over ``tokenizer``'s vocabulary; its generation
    config stops at the end-of-turn token, so answers end where the supervised ones did."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    shape = MODEL_SIZES[size] if isinstance(size, str) else size
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.heads, max_position_embeddings=max_positions,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.eos_token_id)
    return model


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)


def load_tokenizer(folder: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))
