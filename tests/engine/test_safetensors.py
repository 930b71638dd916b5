"""HF-layout checkpoints (config.json + safetensors + tokenizer.json): logits equal transformers'."""

from __future__ import annotations

import pytest
import torch

from frota.engine.loader import load_model, resolve_model

from .reference import reference_logits

transformers = pytest.importorskip("transformers")


def save_tiny_llama(path, tie: bool) -> torch.nn.Module:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=5000.0, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    vocab = {chr(i + 0x100): i for i in range(300)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_safetensors_llama_logits_match_transformers(tmp_path, tie):
    hf = save_tiny_llama(tmp_path, tie)
    assert resolve_model(str(tmp_path)).kind == "safetensors"
    model, cfg, _ = load_model(str(tmp_path), torch.float32, torch.device("cpu"), verbose=False)
    assert cfg.tie_word_embeddings == tie and cfg.rope_theta == 5000.0
    ids = [5, 9, 200, 17, 3, 250, 11]
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(reference_logits(model, ids), expected, atol=1e-4, rtol=1e-4)
