"""Builders shared by the engine tests: tiny random HF models and reference outputs."""

from __future__ import annotations

import torch

# prompts (token ids) and output lengths shared by the equality tests: lengths vary so that
# chunks, admissions and completions fall at different steps
PROMPT_LENS = [3, 17, 9, 40, 1, 26]
MAX_TOKENS = [12, 6, 20, 9, 15, 11]


def _hf_config(arch: str):
    import transformers

    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return transformers.LlamaConfig(
            **common,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "qwen2":
        common["tie_word_embeddings"] = True
        return transformers.Qwen2Config(**common)
    if arch == "mistral":
        return transformers.MistralConfig(**common, sliding_window=16)
    raise ValueError(arch)


def build_hf_model(arch: str, path, seed: int = 0):
    """Save a random HF model of `arch` into `path`; returns the HF model (eval, float32)."""
    import transformers

    torch.manual_seed(seed)
    cfg = _hf_config(arch)
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[arch]
    model = cls(cfg).to(torch.float32).eval()
    with torch.no_grad():  # biases are zero at init: make the Qwen2 q/k/v bias matter
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def prompts(vocab: int = 300, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def hf_greedy(model, prompt_ids, max_tokens):
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()
