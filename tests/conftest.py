"""Shared test setup: offline Hugging Face, a throwaway kb_gym cache, the ``gpu`` marker, ``official_dir()``,
and ``tiny_lm`` (a one-layer causal LM with a tokenizer, built offline, for the TRL tests).

The environment variables are set at import, before any test module imports ``datasets`` or
``kb_gym``, so no test waits on network retries and no test writes results or baselines to
``~/.cache``.
"""

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ["KB_GYM_CACHE"] = tempfile.mkdtemp(prefix="kb_gym_test_cache_")


def official_dir() -> Path:
    """The official KernelBench set (level_N.jsonl): KB_GYM_TEST_OFFICIAL, else ../shared/kernelbench.

    Skips the calling test when the folder is absent.
    """
    env = os.environ.get("KB_GYM_TEST_OFFICIAL")
    path = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "kernelbench"
    if not path.is_dir():
        pytest.skip(f"official KernelBench set not found at {path} (set KB_GYM_TEST_OFFICIAL)")
    return path


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # lazily: only when some test needs a GPU

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def official_path() -> Path:
    """``official_dir()`` as a fixture (skips when the set is absent)."""
    return official_dir()


@pytest.fixture
def tiny_lm():
    """A one-layer Llama with a character tokenizer and a chat template, built offline in a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", "<unk>", "\n", "\t", *map(chr, range(32, 127))])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=8192, pad_token_id=0, bos_token_id=1,
                                         eos_token_id=1))
    return model, tokenizer
