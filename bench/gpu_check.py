"""Checks of the engine's CUDA paths, one step per process (bench/device_check.sh runs them all).

    python bench/gpu_check.py prepare                 # here, once: .devcheck/ (tokenizer, text)
    python bench/gpu_check.py env
    python bench/gpu_check.py model --size 1b --dir /tmp/dc-model [--device cuda]
    python bench/gpu_check.py correctness --dir /tmp/dc-model --device cuda
    python bench/gpu_check.py quant --dir /tmp/dc-model --device cuda
    python bench/gpu_check.py server --dir /tmp/dc-model

The model is a randomly initialised Llama (transformers' own init, saved in HF layout) with
SmolLM2's tokenizer, which `prepare` writes from the GGUF into .devcheck/ (a few MB that can
travel to a machine without the GGUF). Every result is one JSON line on stdout, also appended
to $OUT/results.jsonl; a failing check prints its error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from engine_throughput import TEXT, free_device, load_hf  # bench/ is on sys.path: a script there

ROOT = Path(__file__).resolve().parent.parent
DEVCHECK = ROOT / ".devcheck"

# Llama-3.2-1B's shape with SmolLM2's vocabulary (and plain RoPE: Frota has no rope scaling).
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}


def emit(step: str, **fields) -> dict:
    line = {"step": step, **fields}
    text = json.dumps(line, default=str)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "results.jsonl", "a") as f:
            f.write(text + "\n")
    return line


FAILED = object()


def guarded(step: str, check: str, fn, *args, **kwargs):
    """Run one check; on failure emit its error and carry on."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        traceback.print_exc()
        emit(step, check=check, ok=False, error=f"{type(exc).__name__}: {exc}"[:2000],
             seconds=round(time.perf_counter() - t0, 2))
        if isinstance(exc, KeyboardInterrupt):
            raise
        return FAILED


def text_path() -> Path:
    return TEXT if TEXT.is_file() else DEVCHECK / "GPL-3"


# ------------------------------------------------------------------ prepare (here)


def prepare(args) -> None:
    """Write .devcheck/tokenizer/ (tokenizer.json, tokenizer_config.json, ids.json) from the
    SmolLM2 GGUF with Frota's own GGUF tokenizer code, and a copy of the GPL-3 text."""
    from gguf import GGUFReader

    from frota.engine.loader import resolve_model
    from frota.engine.loader.gguf import read_config, read_tokenizer

    reader = GGUFReader(resolve_model("smollm2").path)
    cfg = read_config(reader)
    tok = read_tokenizer(reader, cfg)
    dest = DEVCHECK / "tokenizer"
    dest.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(dest / "tokenizer.json"))
    eos = tok.eos_token_ids[0]
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template,
        "bos_token": tok.backend.id_to_token(cfg.bos_token_id),
        "eos_token": tok.backend.id_to_token(eos),
        "add_bos_token": tok.add_bos_token,
    }, indent=1))
    (dest / "ids.json").write_text(json.dumps({
        "vocab_size": cfg.vocab_size, "bos_token_id": cfg.bos_token_id, "eos_token_id": eos}))
    shutil.copy(TEXT, DEVCHECK / "GPL-3")
    size = sum(p.stat().st_size for p in DEVCHECK.rglob("*") if p.is_file())
    emit("prepare", dir=str(DEVCHECK), bytes=size, vocab=cfg.vocab_size, bos=cfg.bos_token_id,
         eos=eos)


# ------------------------------------------------------------------ env


def env(args) -> None:
    import importlib

    info: dict = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "numpy", "tokenizers", "safetensors", "pydantic",
                 "openai", "httpx", "aiohttp", "gguf", "httptools", "pytest", "pytest_asyncio",
                 "typing_extensions", "anyio", "jinja2", "prometheus_client"):
        try:
            module = importlib.import_module(name)
            info[name] = getattr(module, "__version__", "?")
        except Exception as exc:
            info[name] = f"MISSING ({type(exc).__name__}: {exc})"
    import torch

    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2**30, 1),
                    sms=props.multi_processor_count, devices=torch.cuda.device_count())
    for module in ("frota.engine", "frota.engine.llm_engine", "frota.server.app",
                   "frota.cli.main", "frota.engine.quant.linear"):
        try:
            importlib.import_module(module)
            info[module] = "ok"
        except Exception as exc:
            info[module] = f"FAILED ({type(exc).__name__}: {exc})"
    emit("env", **info)


# ------------------------------------------------------------------ model


def make_model(directory: Path, size: str, device: str, seed: int = 0) -> dict:
    """A random Llama in HF layout (bf16 safetensors) plus the carried tokenizer files."""
    import torch
    import transformers

    ids = json.loads((DEVCHECK / "tokenizer" / "ids.json").read_text())
    cfg = transformers.LlamaConfig(
        vocab_size=ids["vocab_size"], max_position_embeddings=4096, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=ids["bos_token_id"],
        eos_token_id=ids["eos_token_id"], **SHAPES[size])
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEVCHECK / "tokenizer" / f, directory / f)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    size_bytes = sum(p.stat().st_size for p in directory.iterdir())
    return emit("model", size=size, dir=str(directory), params=params, bytes=size_bytes,
                seconds=round(time.perf_counter() - t0, 2), config=SHAPES[size])


def model_cmd(args) -> None:
    make_model(Path(args.dir), args.size, args.device)


# ------------------------------------------------------------------ engine helpers


def make_engine(model_dir: str, device: str, dtype: str, **kw):
    from frota.engine import EngineArgs
    from frota.engine.llm_engine import LLMEngine

    kw.setdefault("kv_cache_memory", (4 << 30) if device == "cuda" else (256 << 20))
    kw.setdefault("max_num_seqs", 32)
    return LLMEngine(EngineArgs(model=model_dir, device=device, dtype=dtype, verbose=False, **kw))


def prompts_for(tokenizer, lengths: list[int]) -> list[list[int]]:
    ids = tokenizer.encode(text_path().read_text())
    starts = [0, 1000, 2500, 4000, 5500, 7000]
    return [ids[s : s + n] for s, n in zip(starts, lengths, strict=False)]


def engine_generate(engine, prompts: list[list[int]], n: int, tag: str = "r"):
    """Greedy, ignore_eos: (tokens per prompt, seconds, first-step logits per prompt [cpu f32])."""
    from frota.engine import SamplingParams

    first: dict[str, object] = {}
    original = engine.runner.run

    def run(batch):
        logits, seqs = original(batch)
        if logits is not None:
            for i, s in enumerate(seqs):
                if s.request_id not in first:
                    first[s.request_id] = logits[i].float().cpu()
        return logits, seqs

    engine.runner.run = run
    names = [f"{tag}{i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {name: [] for name in names}
    t0 = time.perf_counter()
    try:
        for name, p in zip(names, prompts, strict=True):
            engine.add_request(name, p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        while engine.has_unfinished:
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
    finally:
        engine.runner.run = original
    seconds = time.perf_counter() - t0
    return [tokens[n_] for n_ in names], seconds, [first[n_] for n_ in names]


def prefix_agree(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def hf_greedy(model, ids: list[int], n: int, device: str):
    """(first-step logits [cpu f32], n greedy tokens) with the model's own KV cache."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True)
        first = out.logits[0, -1].float().cpu()
        nxt = out.logits[0, -1].argmax()
        toks: list[int] = []
        while True:
            toks.append(int(nxt))
            if len(toks) == n:
                break
            out = model(input_ids=nxt.view(1, 1), past_key_values=out.past_key_values,
                        use_cache=True)
            nxt = out.logits[0, -1].argmax()
    return first, toks


def hf_teacher_forced(model, ids: list[int], engine_tokens: list[int], device: str):
    """HF's argmax at every position of the engine's own continuation: (agreeing positions,
    the largest logit margin by which HF preferred another token where they disagree)."""
    import torch

    with torch.inference_mode():
        full = torch.tensor([ids + engine_tokens], device=device)
        logits = model(input_ids=full).logits[0, len(ids) - 1 : len(ids) - 1 + len(engine_tokens)]
        logits = logits.float()
        pred = logits.argmax(-1)
        want = torch.tensor(engine_tokens, device=device)
        agree = int((pred == want).sum())
        bad = (pred != want).nonzero().flatten()
        margin = 0.0
        if bad.numel():
            rows = logits[bad]
            margin = float((rows.gather(1, pred[bad, None]) - rows.gather(1, want[bad, None])).max())
    return agree, margin


def compare_engine_hf(step: str, model_dir: str, device: str, dtype: str, lengths: list[int],
                      n: int, **engine_kw) -> dict:
    import torch

    engine = make_engine(model_dir, device, dtype, **engine_kw)
    prompts = prompts_for(engine.tokenizer, lengths)
    engine_generate(engine, prompts[:1], 2, tag="warm")
    tokens, seconds, first = engine_generate(engine, prompts, n)
    del engine
    free_device(device)
    hf = load_hf(dtype, model_dir, device)
    rows = []
    for p, toks, f in zip(prompts, tokens, first, strict=True):
        hf_first, hf_toks = hf_greedy(hf, p, n, device)
        tf_agree, margin = hf_teacher_forced(hf, p, toks, device)
        diff = (f - hf_first).abs().max().item()
        rows.append({"prompt_len": len(p), "prefix_agree": prefix_agree(toks, hf_toks),
                     "teacher_forced_agree": tf_agree, "max_disagree_margin": round(margin, 5),
                     "first_logits_max_abs_diff": diff,
                     "first_logits_absmax": f.abs().max().item(),
                     "first_top1_same": int(f.argmax()) == int(hf_first.argmax())})
    del hf
    free_device(device)
    total = n * len(prompts)
    tf = sum(r["teacher_forced_agree"] for r in rows)
    max_diff = max(r["first_logits_max_abs_diff"] for r in rows)
    tight = dtype == "float32"
    ok = (tf == total and max_diff < 2e-3) if tight else (tf >= 0.9 * total)
    return emit(step, check=f"engine_vs_transformers_{dtype}", device=device, dtype=dtype,
                engine_kw={k: v for k, v in engine_kw.items() if k != "kv_cache_memory"},
                ok=ok, n_tokens=n, teacher_forced_agree=f"{tf}/{total}",
                prefix_agree=[r["prefix_agree"] for r in rows],
                first_logits_max_abs_diff=max_diff,
                engine_seconds=round(seconds, 3), torch=torch.__version__, rows=rows)


def compare_devices(step: str, model_dir: str, device: str, lengths: list[int], n: int) -> dict:
    """The same small model in float32: the engine on `device` against the engine on the CPU,
    and on `device` with chunked prefill and prefix-cache hits against its plain run."""
    results = {}
    variants = [("cpu", "cpu", {}), ("dev", device, {}),
                ("dev_chunked", device, {"max_num_batched_tokens": 48}),
                ("dev_prefix_hit", device, {})]
    prompts = None
    engine = None
    for name, dev, kw in variants:
        if name != "dev_prefix_hit":  # the prefix-hit run reuses the chunked engine's cache
            engine = make_engine(model_dir, dev, "float32", **kw)
        if prompts is None:
            prompts = prompts_for(engine.tokenizer, lengths)
        tokens, seconds, first = engine_generate(engine, prompts, n, tag=name)
        results[name] = (tokens, first, seconds)
        if name in ("cpu", "dev"):
            del engine
            engine = None
            free_device(dev)
    hits = engine.stats().prefix_cache_hits if engine is not None else None
    del engine
    free_device(device)
    cpu_tokens, cpu_first, _ = results["cpu"]
    out = {}
    for name in ("dev", "dev_chunked", "dev_prefix_hit"):
        tokens, first, seconds = results[name]
        ref_tokens, ref_first = (cpu_tokens, cpu_first) if name == "dev" else results["dev"][:2]
        diff = max((a - b).abs().max().item() for a, b in zip(first, ref_first, strict=True))
        same = sum(a == b for a, b in zip(tokens, ref_tokens, strict=True))
        out[name] = {"vs": "cpu" if name == "dev" else "dev", "same_sequences": f"{same}/{len(tokens)}",
                     "prefix_agree": [prefix_agree(a, b) for a, b in zip(tokens, ref_tokens, strict=True)],
                     "first_logits_max_abs_diff": diff, "seconds": round(seconds, 3)}
    ok = all(v["same_sequences"].split("/")[0] == v["same_sequences"].split("/")[1]
             and v["first_logits_max_abs_diff"] < 1e-3 for v in out.values())
    return emit(step, check="engine_float32_device_vs_cpu", device=device, ok=ok, n_tokens=n,
                prefix_cache_hit_tokens=hits, **out)


def correctness(args) -> None:
    step = "correctness"
    lengths = [7, 40, 150, 500]
    n = args.tokens
    guarded(step, "engine_vs_transformers_bfloat16", compare_engine_hf, step, args.dir,
            args.device, "bfloat16" if args.device == "cuda" else "float32", lengths, n)
    if args.device == "cuda":
        guarded(step, "engine_vs_transformers_float32", compare_engine_hf, step, args.dir,
                args.device, "float32", lengths, n)
    small = Path(args.small_dir)
    if not (small / "config.json").is_file():
        guarded(step, "make_small_model", make_model, small, "small", "cpu")
    guarded(step, "engine_float32_device_vs_cpu", compare_devices, step, str(small), args.device,
            [5, 33, 200], n)


# ------------------------------------------------------------------ quant


def kernel_census(model, dtype, device: str) -> dict:
    """Which kernel every quantized linear picks for a decode row and a 256-row prefill."""
    from collections import Counter

    import torch

    from frota.engine.quant.linear import QuantLinear

    out = {}
    for label, rows in (("decode_1_row", 1), ("prefill_256_rows", 256)):
        counts: Counter = Counter()
        for module in model.modules():
            if isinstance(module, QuantLinear):
                x = torch.zeros(rows, module.in_features, dtype=dtype, device=device)
                counts[f"{type(module).__name__}:{module.kernel_name(x)}"] += 1
        out[label] = dict(counts)
    return out


def quant_one(step: str, model_dir: str, device: str, dtype: str, method: str, prompts,
              ref_tokens, ref_first, n: int, **kw) -> dict:
    from frota.engine.quant.apply import quantized_weight_bytes

    t0 = time.perf_counter()
    engine = make_engine(model_dir, device, dtype, quantization=method, **kw)
    load_s = time.perf_counter() - t0
    model = engine.runner.model
    census = kernel_census(model, engine.dtype, device)
    engine_generate(engine, prompts[:1], 2, tag="warm")
    tokens, seconds, first = engine_generate(engine, prompts, n, tag="b")
    _, one_s, _ = engine_generate(engine, prompts[:1], n, tag="one")
    agree = sum(prefix_agree(a, b) for a, b in zip(tokens, ref_tokens, strict=True))
    same_pos = sum(x == y for a, b in zip(tokens, ref_tokens, strict=True)
                   for x, y in zip(a, b, strict=True))
    rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(first, ref_first, strict=True))
    top1 = sum(int(a.argmax()) == int(b.argmax()) for a, b in zip(first, ref_first, strict=True))
    result = emit(step, check=f"quant_{method}", method=method, ok=True, device=device, dtype=dtype,
                  kv_cache_dtype=kw.get("kv_cache_dtype", "auto"),
                  load_s=round(load_s, 2), weight_mb=round(quantized_weight_bytes(model) / 2**20, 1),
                  batch=len(prompts), n_tokens=n,
                  batch_tok_per_s=round(len(prompts) * n / seconds, 1),
                  batch1_tok_per_s=round(n / one_s, 1),
                  vs_unquantized={"prefix_agree_tokens": f"{agree}/{n * len(prompts)}",
                                  "same_position_tokens": f"{same_pos}/{n * len(prompts)}",
                                  "first_logits_max_rel_diff": round(rel, 5),
                                  "first_top1_same": f"{top1}/{len(prompts)}"},
                  kernels=census)
    del engine, model
    free_device(device)
    return result


def quant(args) -> None:
    step = "quant"
    device = args.device
    dtype = "bfloat16"
    n = args.tokens
    from frota.engine.quant.apply import quantized_weight_bytes

    engine = make_engine(args.dir, device, dtype)
    prompts = prompts_for(engine.tokenizer, [16, 64, 128, 256, 40, 90]) * 2  # 12 requests
    engine_generate(engine, prompts[:1], 2, tag="warm")
    ref_tokens, seconds, ref_first = engine_generate(engine, prompts, n, tag="b")
    _, one_s, _ = engine_generate(engine, prompts[:1], n, tag="one")
    emit(step, check="quant_none", method="none", ok=True, device=device, dtype=dtype,
         weight_mb=round(quantized_weight_bytes(engine.runner.model) / 2**20, 1),
         batch=len(prompts), n_tokens=n, batch_tok_per_s=round(len(prompts) * n / seconds, 1),
         batch1_tok_per_s=round(n / one_s, 1))
    del engine
    free_device(device)
    for method in ("int8", "int4", "fp8"):
        guarded(step, f"quant_{method}", quant_one, step, args.dir, device, dtype, method,
                prompts, ref_tokens, ref_first, n)
    guarded(step, "quant_none_kv_int8", quant_one, step, args.dir, device, dtype, "none",
            prompts, ref_tokens, ref_first, n, kv_cache_dtype="int8")


# ------------------------------------------------------------------ server


def server(args) -> None:
    import socket
    import subprocess
    import threading

    import httpx

    step = "server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    name = "rand-llama"
    out_dir = Path(os.environ.get("OUT") or "/tmp")
    log_path = out_dir / "worker.log"
    cmd = [sys.executable, "-m", "frota.cli.main", "worker", "--model", args.dir,
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "bfloat16" if args.device == "cuda" else "float32",
           "--kv-cache-memory", "4GiB" if args.device == "cuda" else "256MiB",
           "--max-num-seqs", "16", "--shutdown-grace-period", "10"]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        ready = False
        while time.perf_counter() - t0 < args.ready_timeout:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    ready = True
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        emit(step, check="ready", ok=ready, seconds=round(time.perf_counter() - t0, 2),
             exit_code=proc.poll())
        if not ready:
            print(log_path.read_text()[-4000:], flush=True)
            return
        guarded(step, "openai_client", openai_checks, step, url, name, args.dir)
        guarded(step, "concurrent", concurrent_checks, step, url, name, threading)
        r = httpx.get(f"{url}/metrics", timeout=10)
        gen = [line for line in r.text.splitlines() if line.startswith("vllm:generation_tokens_total")]
        emit(step, check="metrics", ok=r.status_code == 200, status=r.status_code,
             generation_tokens=gen[:2])
    finally:
        t1 = time.perf_counter()
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        emit(step, check="shutdown", ok=code == 0, exit_code=code,
             seconds=round(time.perf_counter() - t1, 2))
        tail = log_path.read_text()[-3000:]
        print("--- worker log tail ---\n" + tail, flush=True)


def openai_checks(step: str, url: str, name: str, model_dir: str) -> None:
    import openai
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    models = [m.id for m in client.models.list()]
    prompt = "The capital of France is"
    n_prompt = len(tok.encode(prompt, add_special_tokens=False).ids)
    t0 = time.perf_counter()
    full = client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True})
    full_s = time.perf_counter() - t0
    stream = list(client.completions.create(
        model=name, prompt=prompt, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    stream_text = "".join(c.choices[0].text for c in stream if c.choices)
    usage = stream[-1].usage
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12,
        temperature=0)
    chat_stream = list(client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    chat_text = "".join((c.choices[0].delta.content or "") for c in chat_stream if c.choices)
    sampled = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0.8,
                                        n=2, seed=7, extra_body={"ignore_eos": True})
    checks = {
        "models": models == [name],
        "completion_usage": (full.usage.prompt_tokens == n_prompt
                             and full.usage.completion_tokens == 16
                             and full.usage.total_tokens == n_prompt + 16),
        "stream_equals_full": stream_text == full.choices[0].text,
        "stream_usage": usage is not None and usage.completion_tokens == 16
        and usage.prompt_tokens == n_prompt,
        "chat_usage": chat.usage.completion_tokens <= 12 and chat.usage.prompt_tokens > n_prompt,
        "chat_stream_equals_full": chat_text == (chat.choices[0].message.content or ""),
        "chat_stream_usage": chat_stream[-1].usage is not None
        and chat_stream[-1].usage.completion_tokens == chat.usage.completion_tokens,
        "n2": len(sampled.choices) == 2 and sampled.usage.completion_tokens == 16,
    }
    emit(step, check="openai_client", ok=all(checks.values()), checks=checks,
         completion_s=round(full_s, 3), prompt_tokens=full.usage.prompt_tokens,
         completion_tokens=full.usage.completion_tokens, text=full.choices[0].text[:80],
         chat_prompt_tokens=chat.usage.prompt_tokens, finish=full.choices[0].finish_reason)


def concurrent_checks(step: str, url: str, name: str, threading) -> None:
    import httpx

    results: list = []

    def one(i: int) -> None:
        try:
            r = httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": name, "prompt": f"Request {i}: " + "lorem ipsum " * (4 * i + 1),
                "max_tokens": 32, "temperature": 0, "ignore_eos": True})
            body = r.json()
            results.append((r.status_code, body.get("usage", {}).get("completion_tokens")))
        except Exception as exc:
            results.append((repr(exc), None))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    ok = all(code == 200 and n == 32 for code, n in results) and len(results) == 12
    emit(step, check="concurrent_12x32", ok=ok, seconds=round(seconds, 2),
         tok_per_s=round(12 * 32 / seconds, 1), results=results)


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "env", "model", "correctness", "quant", "server"])
    parser.add_argument("--dir", default="/tmp/dc-model")
    parser.add_argument("--small-dir", default="/tmp/dc-model-small")
    parser.add_argument("--size", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--ready-timeout", type=float, default=150.0)
    args = parser.parse_args()
    if args.device == "cpu":
        import torch

        torch.set_num_threads(min(torch.get_num_threads(), int(os.environ.get("THREADS", "2"))))
    handler = {"prepare": prepare, "env": env, "model": model_cmd, "correctness": correctness,
               "quant": quant, "server": server}[args.command]
    t0 = time.perf_counter()
    failed = guarded(args.command, "step", handler, args) is FAILED
    print(f"[gpu_check] {args.command} done in {time.perf_counter() - t0:.1f}s", flush=True)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
