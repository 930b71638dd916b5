"""lm-evaluation-harness's `local-completions` model against a real SmolLM2 worker scores a local
20-question task exactly as transformers does on the same weights (echo + prompt logprobs)."""

from __future__ import annotations

import os

import pytest

from tests.server.harness import WorkerProcess

# About 2.5 minutes on two shared cores (exporting the float32 copy, both evaluations), so
# it runs when asked: FROTA_LM_EVAL=1. bench/lm_eval_parity.py prints the same numbers.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("FROTA_LM_EVAL"), reason="set FROTA_LM_EVAL=1 to run lm-eval parity")]


def test_lm_eval_accuracy_through_frota_equals_transformers(
        smollm2_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("lm_eval")
    from tests.server.lm_eval_parity import export_model, parity

    hf_dir = export_model(tmp_path_factory.mktemp("smollm2-hf"))
    report = parity(smollm2_worker.url, hf_dir)
    assert report["questions"] == 20
    assert 0.0 <= report["frota_accuracy"] <= 1.0
    assert report["frota_accuracy"] == pytest.approx(report["transformers_accuracy"], abs=1e-9)
    assert report["max_loglikelihood_abs_diff"] < 1e-3
