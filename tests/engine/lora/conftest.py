"""LoRA fixtures: SmolLM2 in float32 once per session (the engine's weights and transformers'
reference model), and two PEFT adapters made by PEFT over it, seeded, differing in rank,
targets and scaling (plain alpha/r against rslora), B not zero so each changes the output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# (rank, alpha, rslora, targets) of the two reference adapters
ADAPTERS = {
    "a": (8, 16, False, ["q_proj", "v_proj", "down_proj"]),
    "b": (4, 8, True, ["k_proj", "o_proj", "gate_proj", "up_proj"]),
}
B_SCALE = 0.2  # PEFT inits B to zeros; a random B of this scale changes greedy output


@pytest.fixture(scope="session")
def smollm2_loaded():
    """Frota's SmolLM2 in float32, on the plain path (an engine given `loaded` packs nothing)."""
    from frota.engine.loader import load_model

    return load_model("smollm2", torch.float32, torch.device("cpu"), verbose=False)


@pytest.fixture(scope="session")
def peft_smollm2(tmp_path_factory):
    """(transformers SmolLM2 with PEFT adapters "a" and "b", {name: saved directory})."""
    from frota.engine.loader import resolve_model

    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    gguf = Path(resolve_model("smollm2").path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    model, dirs = None, {}
    for i, (name, (rank, alpha, rslora, targets)) in enumerate(ADAPTERS.items()):
        torch.manual_seed(100 + i)
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora,
                                 target_modules=targets, lora_dropout=0.0)
        if model is None:
            model = peft.get_peft_model(hf, config, adapter_name=name)
        else:
            model.add_adapter(name, config)
        with torch.no_grad():
            for module_name, p in model.named_parameters():
                if f"lora_B.{name}." in module_name:
                    p.normal_(0, B_SCALE)
        out = tmp_path_factory.mktemp(f"adapter_{name}")
        model.save_pretrained(str(out), selected_adapters=[name])
        dirs[name] = next(p.parent for p in out.rglob("adapter_config.json"))
    model.eval()
    model.generation_config.eos_token_id = None
    return model, dirs


@pytest.fixture(scope="session")
def reference_greedy(peft_smollm2):
    """`reference_greedy(adapter or None, ids, n)`: transformers + PEFT greedy tokens, cached."""
    model, _ = peft_smollm2
    cache: dict[tuple, list[int]] = {}

    def greedy(adapter: str | None, ids: list[int], num_tokens: int) -> list[int]:
        key = (adapter, tuple(ids), num_tokens)
        if key not in cache:
            with torch.inference_mode():
                prompt = torch.tensor([ids])
                # no EOS: the engine's requests ignore it (they run on, EOS unmasked)
                kwargs = dict(max_new_tokens=num_tokens, do_sample=False, pad_token_id=0)
                if adapter is None:
                    with model.disable_adapter():
                        out = model.generate(prompt, **kwargs)
                else:
                    model.set_adapter(adapter)
                    out = model.generate(prompt, **kwargs)
            cache[key] = out[0, len(ids):].tolist()
        return cache[key]

    return greedy


@pytest.fixture(scope="module")
def loaded():
    """The synthetic model (tests.engine.lora.synthetic), loaded once per module: engines wrap its
    projections in place, so modules do not share it."""
    from tests.engine.lora import synthetic

    return synthetic.load()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, loaded):
    """Three adapters over the synthetic model, a0..a2, differing in rank and targets."""
    from tests.engine.lora import synthetic

    return synthetic.make_adapters(tmp_path_factory.mktemp("adapters"), loaded[1], count=3)
