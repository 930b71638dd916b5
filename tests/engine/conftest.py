"""Engine tests run on a shared CPU: one intra-op thread avoids OpenMP threads spinning against
each other when the cores are oversubscribed (tens of times slower), and costs little here.

transformers' float32 SmolLM2, the reference of the exactness tests, is loaded once per session."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def hf_smollm2():  # type: ignore[no-untyped-def]
    """transformers' SmolLM2 in float32, from the same GGUF file the engine loads."""
    from pathlib import Path

    from frota.engine.loader import resolve_model

    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    gguf_path = Path(resolve_model("smollm2").path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    return model.eval()
