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


def test_safetensors_tensors_are_views_of_the_mapped_file_with_their_values(tmp_path):
    from safetensors.torch import load_file, save_file

    from frota.engine.loader.safetensors import mapped_tensors

    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16),
               "c": torch.randn(2, 2, 2).to(torch.float16), "d": torch.arange(6).view(2, 3),
               "e": torch.tensor(1.5)}
    save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt"})
    reference = load_file(tmp_path / "m.safetensors")
    mapped = dict(mapped_tensors(tmp_path / "m.safetensors"))
    assert mapped.keys() == reference.keys()
    for name, tensor in mapped.items():
        assert tensor.dtype == reference[name].dtype and torch.equal(tensor, reference[name]), name
    # one mapping of the file serves every tensor: nothing was read into a copy
    assert len({t.untyped_storage().data_ptr() for t in mapped.values()}) == 1


def test_a_truncated_safetensors_file_is_refused_by_name(tmp_path):
    from frota.engine.errors import UnsupportedModelError
    from frota.engine.loader.safetensors import mapped_tensors

    (tmp_path / "bad.safetensors").write_bytes(b"\xff\xff\xff\x00\x00\x00\x00\x00{}")
    with pytest.raises(UnsupportedModelError, match=r"bad\.safetensors"):
        list(mapped_tensors(tmp_path / "bad.safetensors"))
