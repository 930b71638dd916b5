"""The synchronous engine: requests in, one `step()` at a time, deltas out.

Start-up reads in order: load the model (this rank's shard, when sharded; on the CPU its
linears packed and the C++ kernels built) -> the adapter slots -> size the KV cache from the
memory they leave -> build the scheduler and the runner over it. `step()` is schedule ->
run the model -> sample -> postprocess.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from frota.engine import compute
from frota.engine.block_manager import BlockManager
from frota.engine.config import EngineArgs
from frota.engine.context import fit_to_context
from frota.engine.detokenizer import IncrementalDetokenizer
from frota.engine.errors import InvalidRequestError
from frota.engine.grammar import Grammars
from frota.engine.kv_sizing import size_kv_cache
from frota.engine.loader.quantized import load_as_served
from frota.engine.lora.adapter import LoadedAdapter
from frota.engine.lora.errors import AdapterError, AdapterInfo
from frota.engine.lora.manager import LoRAManager, adapter_slots
from frota.engine.model_runner import ModelRunner
from frota.engine.outputs import EngineStats, RequestOutput, TokenLogprob
from frota.engine.parallel.runner import ParallelContext, join_group
from frota.engine.progress import progress
from frota.engine.sampler import Sampler
from frota.engine.sampling_params import SamplingParams
from frota.engine.scheduler import Scheduler
from frota.engine.sequence import Sequence
from frota.engine.stopping import StopRule

if TYPE_CHECKING:
    from frota.engine.loader import Loaded


class LLMEngine:
    """Owns the model runner, the scheduler and the per-request detokenizers."""

    def __init__(self, args: EngineArgs, loaded: Loaded | None = None) -> None:
        """`loaded`: an already loaded (model, config, tokenizer), to share weights between
        engines; the engine then runs where those weights are, whatever `args.device` says,
        and takes its linears as they are (nothing packed)."""
        self.args = args
        device = compute.resolve_device(args.device) if loaded is None else compute.device_of(loaded[0])
        self.dtype = compute.resolve_dtype(args.dtype, device)
        self.parallel: ParallelContext | None = None  # when sharded
        if loaded is None and args.tensor_parallel_size * args.pipeline_parallel_size > 1:
            self.parallel = join_group(args, device, self.dtype)
            device, loaded = self.parallel.device, self.parallel.loaded
        elif loaded is None:
            loaded = load_as_served(args.model, args.quantization, self.dtype, device, args.verbose)
            compute.prepare_cpu(loaded[0], device, args.verbose)
        self.device = device
        self.loaded = loaded
        model, cfg, self.tokenizer = loaded
        self.model_config = cfg
        # the adapter slots, then the KV cache from the memory they leave
        if self.parallel is None:
            self.lora = adapter_slots(args, model, cfg, self.dtype, device)
            kv = size_kv_cache(args, cfg, self.dtype, device)
        else:  # this rank's shard of the slots and of the KV cache
            self.lora = adapter_slots(args, model, cfg, self.dtype, device, self.parallel.lora_shard())
            kv = size_kv_cache(args, self.parallel.local_cfg, self.dtype, device,
                               self.parallel.comm.min_int)
        self.max_model_len = kv.max_model_len
        self.block_manager = BlockManager(kv.num_blocks, args.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs,
                                   args.max_num_batched_tokens, self.lora)
        self.runner = ModelRunner(model, cfg, kv.num_blocks, args.block_size, self.dtype, device,
                                  args.kv_cache_dtype, self.lora) if self.parallel is None else \
            self.parallel.make_runner(kv.num_blocks, args.block_size, self.dtype, self.lora)
        self.sampler = Sampler(args.seed, self.tokenizer.eos_token_ids)
        self.stop_rule = StopRule(self.tokenizer.eos_token_ids, kv.max_model_len)
        self.requests: dict[str, tuple[Sequence, IncrementalDetokenizer]] = {}
        progress(args.verbose, f"KV cache: {kv.num_blocks} blocks of {args.block_size} tokens; "
                               f"max_model_len {kv.max_model_len}; device {device}")
        progress(args.verbose, f"compute: {compute.describe_compute(args.dtype, self.dtype, device)}")

    def make_sequence(self, request_id: str, prompt: str | list[int],
                      params: SamplingParams, adapter: str | None = None) -> Sequence:
        """Validate a request and build its Sequence; raises InvalidRequestError, or
        AdapterError for an `adapter` (a loaded adapter's name; None: the base model) that
        is not loaded."""
        params.validate()
        loaded_adapter = self._adapter(adapter) if adapter is not None else None
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", "request_id")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        # A prompt may fill the window: it then gets one token, finish_reason "length".
        fit_to_context(len(ids), self.max_model_len, room=0)
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        if any(not 0 <= t < vocab for t in params.logit_bias or ()):
            raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab})", "logit_bias")
        if params.prompt_logprobs is not None and self.parallel is not None:
            raise InvalidRequestError("prompt logprobs (echo with logprobs) are not supported "
                                      "with tensor or pipeline parallelism yet", "echo")
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        # a grammar is compiled now, so a bad one is a 400, never later
        matcher = self.grammars.matcher(params.constraint) if params.constraint is not None else None
        return Sequence(request_id, ids, params, generator, loaded_adapter, matcher)

    @functools.cached_property
    def grammars(self) -> Grammars:
        """Built on the first constrained request (its vocabulary scan takes ~0.1 s)."""
        return Grammars(self.tokenizer)

    def add_sequence(self, seq: Sequence) -> None:
        self.requests[seq.request_id] = (seq, IncrementalDetokenizer(self.tokenizer, seq.params.stop))
        self.scheduler.add(seq)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    adapter: str | None = None) -> None:
        self.add_sequence(self.make_sequence(request_id, prompt, params, adapter))

    # -- LoRA adapters (frota.engine.lora) -------------------------------------------------

    def _lora_on(self) -> LoRAManager:
        if self.lora is None:
            raise AdapterError("LoRA is not enabled: start the engine with max_loras > 0 "
                               "(the worker's --enable-lora --max-loras N)", "lora_disabled")
        return self.lora

    def _adapter(self, name: str) -> LoadedAdapter:
        return self._lora_on().get(name)

    def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Read and validate the PEFT adapter at `path` into host memory under `name`; it
        takes a slot when a request needs it. Raises AdapterError (nothing else changes)."""
        return self._lora_on().load(name, path)

    def unload_adapter(self, name: str) -> None:
        """New requests for `name` fail from now on; requests already accepted finish under
        the weights they started with."""
        self._lora_on().unload(name)

    def adapters(self) -> list[AdapterInfo]:
        return self.lora.infos() if self.lora is not None else []

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request now and free its blocks; None if it is not known."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return None
        seq, _ = entry
        self.scheduler.finish(seq, "abort")
        return self._output(seq, [], "", None, True)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return a delta for every request that advanced."""
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        logits, seqs = self.runner.run(batch)
        self.scheduler.postprocess(batch)
        if logits is None:
            return []
        tokens, logprobs = self.sampler(logits, seqs)
        outputs = []
        for seq, token, lp in zip(seqs, tokens, logprobs, strict=True):
            # The prompt's scores go out once, with the first output.
            first = seq.num_generated_tokens == 0
            prompt_lps = seq.prompt_logprobs if first and seq.prompt_logprobs else None
            if seq.params.max_tokens == 0:  # scoring only: nothing is generated
                self.scheduler.finish(seq, "length")
                del self.requests[seq.request_id]
                outputs.append(self._output(seq, [], "", None, True, prompt_lps))
                continue
            seq.append_token(token)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            outputs.append(self.emit(seq, [lp] if lp else None, prompt_lps))
        return outputs

    def emit(self, seq: Sequence, logprobs: list[TokenLogprob] | None = None,
             prompt_logprobs: list | None = None) -> RequestOutput:
        """The output of `seq`'s newest token (already appended): its text, and whether it
        finishes the sequence (`StopRule`), which then gives its blocks back."""
        token = seq.token_ids[-1]
        detok = self.requests[seq.request_id][1]
        reason = self.stop_rule.finish_reason(seq, stop_string_hit=detok.add(token))
        if reason is not None:
            self.scheduler.finish(seq, reason)
            del self.requests[seq.request_id]
        text = detok.flush(finished=reason is not None)
        return self._output(seq, [token], text, logprobs, reason is not None, prompt_logprobs)

    def _output(self, seq: Sequence, new_ids: list[int], text: str,
                logprobs: list[TokenLogprob] | None, finished: bool,
                prompt_logprobs: list | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=new_ids, new_text=text,
            new_logprobs=logprobs, finished=finished,
            finish_reason=seq.finish_reason if finished else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_generated_tokens=seq.num_generated_tokens,
            num_cached_tokens=seq.num_cached_tokens, prompt_logprobs=prompt_logprobs,
        )

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_total=bm.num_blocks, num_kv_blocks_used=bm.num_used_blocks,
            block_size=bm.block_size, prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
            expert_tokens=getattr(self.runner, "expert_tokens", dict)(),
            running_adapters=_adapter_names(self.scheduler.running),
            waiting_adapters=_adapter_names(self.scheduler.waiting),
            max_adapters=self.args.max_loras,
        )


def _adapter_names(seqs: Iterable[Sequence]) -> tuple[str, ...]:
    return tuple(sorted({s.adapter.name for s in list(seqs) if s.adapter is not None}))
