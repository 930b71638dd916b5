"""The official `openai` client against a real `frota worker` serving SmolLM2 with a PEFT
adapter: `model` picks it, its output is the engine's own for that adapter, and vLLM's
runtime load/unload routes work as vLLM clients call them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import SMOLLM2_ARGS
from tests.server.harness import WorkerProcess

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
NUM_TOKENS = 12
LORA_ARGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--allow-runtime-lora")


def _adapter(directory: Path, seed: int) -> Path:
    from frota.plan.model_shapes import SMOLLM2_135M
    from tests.engine.lora.adapters import write_adapter

    return write_adapter(directory, SMOLLM2_135M, rank=8, targets=["q_proj", "v_proj"],
                         alpha=16, seed=seed, scale=0.1)


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("safetensors")
    root = tmp_path_factory.mktemp("adapters")
    return {"sql": _adapter(root / "sql", 1), "late": _adapter(root / "late", 2)}


@pytest.fixture(scope="module")
def lora_worker(tmp_path_factory: pytest.TempPathFactory,
                adapter_dirs: dict[str, Path]) -> Iterator[WorkerProcess]:
    log_path = tmp_path_factory.mktemp("lora-worker") / "worker.log"
    worker = WorkerProcess("smollm2", *SMOLLM2_ARGS, *LORA_ARGS, "--lora-modules",
                           f"sql={adapter_dirs['sql']}", log_path=log_path).wait_ready()
    yield worker
    assert worker.stop() == 0, worker.log()[-3000:]


@pytest.fixture(scope="module")
def reference(adapter_dirs: dict[str, Path]) -> dict[str | None, list[int]]:
    """The engine's own greedy tokens for PROMPT, base and under each adapter."""
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine
    from tests.engine.lora.engines import run

    engine = LLMEngine(EngineArgs(model="smollm2", dtype="float32", max_model_len=2048,
                                  kv_cache_memory=256 * 2**20, max_loras=2, max_lora_rank=8,
                                  verbose=False))
    for name, path in adapter_dirs.items():
        engine.load_adapter(name, str(path))
    ids = engine.tokenizer.encode(PROMPT)
    names: list[str | None] = [None, *adapter_dirs]
    outs = run(engine, [(name, ids) for name in names], NUM_TOKENS)
    return dict(zip(names, outs, strict=True))


@pytest.fixture(scope="module")
def client(lora_worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{lora_worker.url}/v1", api_key="unused", max_retries=0)


def _complete(client: openai.OpenAI, model: str) -> tuple[str, int]:
    """(text, completion tokens) of the greedy completion of PROMPT under `model`."""
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=NUM_TOKENS,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.model == model
    return out.choices[0].text, out.usage.completion_tokens


def test_an_adapter_from_lora_modules_serves_the_engines_own_output(
        client: openai.OpenAI, lora_worker: WorkerProcess, reference, adapter_dirs) -> None:  # type: ignore[no-untyped-def]
    from tests.server.harness import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2", "sql"]
    assert models[1].parent == "smollm2" and models[1].root == str(adapter_dirs["sql"])
    assert reference["sql"] != reference[None], "the test adapter must change the output"
    for model, key in (("smollm2", None), ("sql", "sql")):
        text, count = _complete(client, model)
        assert count == NUM_TOKENS
        assert text == tokenizer.decode(reference[key]), model
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="late", prompt=PROMPT, max_tokens=1)
    assert missing.value.code == "model_not_found"


def test_an_adapter_loaded_at_run_time_serves_then_unloads(
        client: openai.OpenAI, lora_worker: WorkerProcess, reference, adapter_dirs) -> None:  # type: ignore[no-untyped-def]
    from tests.server.harness import load_tokenizer

    url = lora_worker.url
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                        json={"lora_name": "late", "lora_path": str(adapter_dirs["late"])})
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'late' added successfully."
    assert [m.id for m in client.models.list().data] == ["smollm2", "sql", "late"]
    text, _ = _complete(client, "late")
    assert text == load_tokenizer("smollm2").decode(reference["late"])
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'vllm:lora_requests_info{' in metrics and 'max_lora="2"' in metrics

    bad = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                     json={"lora_name": "big", "lora_path": str(adapter_dirs["late"].parent)})
    assert bad.status_code == 400 and bad.json()["error"]["message"]
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=60)
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="late", prompt=PROMPT, max_tokens=1)
