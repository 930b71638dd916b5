"""`frota convert`: SmolLM2's GGUF written as an HF-layout directory that Frota's own
safetensors loader and transformers both read back to the same model."""

from __future__ import annotations

import json

import pytest
import torch

from frota.cli.main import main as frota
from frota.engine.errors import UnsupportedModelError
from frota.engine.loader import load_model, resolve_model
from frota.engine.loader.export import export_hf, hf_tensor_name

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-hf")
    assert frota(["convert", "smollm2", str(out)]) == 0
    return out


def test_written_files_describe_the_model(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (30, 9, 3)
    assert config["tie_word_embeddings"] is True
    tok = json.loads((exported / "tokenizer_config.json").read_text())
    assert tok["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok["chat_template"]
    assert resolve_model(str(exported)).kind == "safetensors"


def test_frota_reads_back_the_same_weights(exported):
    cpu = torch.device("cpu")
    gguf, _, gguf_tok = load_model("smollm2", torch.float32, cpu, verbose=False)
    hf, _, hf_tok = load_model(str(exported), torch.float32, cpu, verbose=False)
    for (name, a), (other, b) in zip(gguf.state_dict().items(), hf.state_dict().items(), strict=True):
        assert name == other
        assert torch.equal(a, b), name
    text = gguf_tok.apply_chat_template(PROMPT)
    assert hf_tok.encode(text) == gguf_tok.encode(text)
    assert hf_tok.eos_token_ids == gguf_tok.eos_token_ids


def test_transformers_serves_it_with_its_chat_template(exported):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(exported)
    model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_refuses_what_needs_no_conversion(tmp_path):
    with pytest.raises(UnsupportedModelError, match="synthetic"):
        export_hf("synthetic:tiny", tmp_path)
    assert frota(["convert", "no-such-model", str(tmp_path)]) == 2


def test_moe_router_weights_take_mixtral_names():
    assert hf_tensor_name("layers.3.mlp.gate.weight") == "model.layers.3.block_sparse_moe.gate.weight"
    assert hf_tensor_name("lm_head.weight") == "lm_head.weight"
    assert hf_tensor_name("embed_tokens.weight") == "model.embed_tokens.weight"
