"""The model runner every rank steps together.

Rank 0 owns the scheduler. Each step it broadcasts a compact description of the
batch (per sequence: the new tokens, their first position, the block table),
and every rank rebuilds the same model inputs from it with the engine's own
`ModelRunner.prepare`. While idle, rank 0 broadcasts a heartbeat, so a dead rank
is noticed within the collective timeout even when no request arrives.

Pipeline parallel: the batch is split into two micro-batches (when it has two
sequences or more); stage s computes micro-batch 0, sends its activations on
(asynchronously) and starts micro-batch 1 while stage s+1 works on micro-batch 0.
The last stage's first tensor rank sends the logits back to rank 0. Time a rank
spends waiting for activations or logits is its pipeline bubble.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from frota.engine.config import EngineArgs, ModelConfig
from frota.engine.lora.layers import applying
from frota.engine.lora.manager import LoRAManager
from frota.engine.lora.slots import ShardRanges
from frota.engine.model_runner import ModelRunner
from frota.engine.parallel.comm import Comm
from frota.engine.parallel.config import ParallelConfig, ParallelConfigError, validate_model
from frota.engine.parallel.layers import ExpertParallelMoE
from frota.engine.parallel.loader import ShardLayout, load_shard, open_checkpoint, shard_bytes
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence

HEARTBEAT_S = 1.0


class _Window:
    """The slice of a sequence's token ids that one step computes (all a follower needs)."""

    def __init__(self, start: int, tokens: list[int]) -> None:
        self.start = start
        self.tokens = tokens

    def __getitem__(self, s: slice) -> list[int]:
        return self.tokens[s.start - self.start : s.stop - self.start]


class _RemoteSeq:
    """What `ModelRunner.prepare` reads from a Sequence, rebuilt from rank 0's broadcast."""

    def __init__(self, start: int, tokens: list[int], num_tokens: int, block_table: list[int],
                 lora_slot: int | None) -> None:
        self.num_computed_tokens = start
        self.token_ids = _Window(start, tokens)
        self.num_tokens = num_tokens
        self.block_table = block_table
        self.lora_slot = lora_slot


def describe(batch: ScheduledBatch, block_size: int) -> list[tuple]:
    """The broadcast form of a batch: (start, n, num_tokens, new tokens, block table, LoRA
    slot or None) per sequence."""
    out = []
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        end = start + n
        out.append((start, n, seq.num_tokens, seq.token_ids[start:end],
                    seq.block_table[: -(-end // block_size)], seq.lora_slot))
    return out


@dataclasses.dataclass
class ParallelContext:
    """A joined rank: its groups, its shard of the model, and the full model's config."""

    pc: ParallelConfig
    comm: Comm
    layout: ShardLayout
    device: torch.device
    loaded: tuple  # (shard model, full config, tokenizer)

    @property
    def local_cfg(self) -> ModelConfig:
        return self.layout.local_config

    def lora_shard(self) -> tuple[range, ShardRanges]:
        """This rank's layers and its slices of the adapted projections (q, KV, MLP), for
        its adapter slots."""
        lay, d, rank = self.layout, self.loaded[1].head_dim, self.pc.tp_rank
        return lay.layers, ShardRanges((rank * lay.num_heads * d, lay.num_heads * d),
                                       (lay.kv_head_start * d, lay.num_kv_heads * d),
                                       (rank * lay.intermediate, lay.intermediate))

    def make_runner(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    lora: LoRAManager | None = None) -> ParallelModelRunner:
        return ParallelModelRunner(self, num_blocks, block_size, dtype, lora)


def parallel_config(args: EngineArgs) -> ParallelConfig:
    return ParallelConfig.from_env(args.tensor_parallel_size, args.pipeline_parallel_size,
                                   args.expert_parallel_size, args.expert_capacity_factor)


def join_group(args: EngineArgs, device: torch.device, dtype: torch.dtype) -> ParallelContext:
    """Join the group (checking every rank has the same config), then load this rank's shard."""
    pc = parallel_config(args)
    if args.quantization != "none" or args.kv_cache_dtype != "auto":
        raise ParallelConfigError("quantization with tensor/pipeline parallelism is not supported "
                                  "yet; use --quantization none --kv-cache-dtype auto")
    if device.type == "cuda":
        device = torch.device("cuda", pc.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    # Validate before joining: a rank with impossible sizes fails alone, at once.
    cfg, tokenizer, weights = open_checkpoint(args.model)
    validate_model(pc, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                   num_layers=cfg.num_layers, intermediate_size=cfg.intermediate_size,
                   num_experts=cfg.num_experts)
    comm = Comm(pc, device)
    comm.join()
    comm.check_same({
        "model": args.model, "dtype": str(dtype), "block_size": args.block_size,
        **pc.fingerprint({}),
        "max_model_len": args.max_model_len, "enable_prefix_caching": args.enable_prefix_caching,
        "max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank,
    })
    model, layout = load_shard(cfg, weights, pc, comm, dtype, device, args.verbose)
    return ParallelContext(pc, comm, layout, device, (model, cfg, tokenizer))


class ParallelModelRunner(ModelRunner):
    """`ModelRunner` over a shard: the same inputs on every rank, collectives inside the model."""

    def __init__(self, ctx: ParallelContext, num_blocks: int, block_size: int,
                 dtype: torch.dtype, lora: LoRAManager | None = None) -> None:
        super().__init__(ctx.loaded[0], ctx.local_cfg, num_blocks, block_size, dtype, ctx.device,
                         lora=lora)
        self.ctx = ctx
        self.pc = ctx.pc
        self.comm = ctx.comm
        self.hidden_size = ctx.layout.cfg.hidden_size
        self.vocab_size = ctx.layout.cfg.vocab_size
        self._last_broadcast = time.monotonic()
        self.is_stopped = False

    # -- rank 0 --------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor | None, list[Sequence]]:
        # the slots the scheduler just wrote: each follower writes its shard of them first
        writes = self.lora.take_writes() if self.lora is not None else []
        self._send_command(("step", describe(batch, self.block_size), writes))
        return self._execute(batch.seqs, batch.num_new_tokens)

    def idle(self) -> None:
        """Rank 0, no work: a heartbeat at most once a second keeps followers (and failure
        detection) going."""
        if time.monotonic() - self._last_broadcast >= HEARTBEAT_S:
            self._send_command(("noop",))

    def stop_followers(self) -> None:
        if not self.is_stopped:
            self.is_stopped = True
            self._send_command(("stop",))

    def _send_command(self, command: tuple) -> None:
        self.comm.broadcast_object(command)
        self._last_broadcast = time.monotonic()

    # -- followers -----------------------------------------------------------------------

    @torch.inference_mode()
    def follow(self) -> None:
        """Step with rank 0 until it says stop; a dead peer raises out of a collective."""
        while True:
            command = self.comm.broadcast_object()
            kind = command[0]
            if kind == "stop":
                self.is_stopped = True
                return
            if kind == "step":
                payload, writes = command[1], command[2]
                if writes:
                    self.lora.apply_writes(writes)
                seqs = [_RemoteSeq(s, toks, nt, table, slot) for s, _, nt, toks, table, slot in payload]
                self._execute(seqs, [item[1] for item in payload])

    # -- every rank ----------------------------------------------------------------------

    def _micro_batches(self, seqs: list, nums: list[int]) -> list[ScheduledBatch]:
        count = min(2, len(seqs)) if self.pc.pipeline > 1 else 1
        size = -(-len(seqs) // count)
        return [ScheduledBatch(list(seqs[i : i + size]), list(nums[i : i + size]))
                for i in range(0, len(seqs), size)]

    def _execute(self, seqs: list, nums: list[int]) -> tuple[torch.Tensor | None, list[Sequence]]:
        t0 = time.perf_counter()
        pc, comm, model = self.pc, self.comm, self.model
        before = (comm.stats.collective_s, comm.stats.bubble_s)
        is_first, is_last = self.ctx.layout.is_first, self.ctx.layout.is_last
        last_stage_head = (pc.pipeline - 1) * pc.tensor
        sends = []
        plans = []
        for mb in self._micro_batches(seqs, nums):
            input_ids, positions, meta, rows, mb_seqs = self.prepare(mb)
            plans.append((len(rows), mb_seqs))
            if is_first:
                x = model.embed_tokens(input_ids)
            else:
                x = comm.recv((input_ids.shape[0], self.hidden_size), self.dtype, pc.rank - pc.tensor)
            with applying(model, self.lora and self.lora.pool, meta.lora):
                for layer, kv_cache in zip(model.layers, self.kv_caches, strict=True):
                    x = layer(positions, x, kv_cache, meta)
            if not is_last:
                sends.append((comm.send(x, pc.rank + pc.tensor), x))
                continue
            if not rows:
                continue
            logits = model.lm_head(model.norm(x[self._tensor(rows)])).float()
            if pc.pipeline == 1:
                plans[-1] = (logits, mb_seqs)
            elif pc.tp_rank == 0:
                sends.append((comm.send(logits, 0), logits))
        result: tuple[torch.Tensor | None, list[Sequence]] = (None, [])
        if pc.rank == 0:
            parts, all_seqs = [], []
            for plan, mb_seqs in plans:
                if isinstance(plan, torch.Tensor):
                    parts.append(plan)
                elif plan:
                    parts.append(comm.recv((plan, self.vocab_size), torch.float32, last_stage_head))
                all_seqs.extend(mb_seqs)
            if parts:
                result = (torch.cat(parts), all_seqs)
        for handle, _ in sends:
            handle.wait()
        dt = time.perf_counter() - t0
        comm.stats.step_s += dt
        comm.stats.num_steps += 1
        if comm.stats.record_history:
            comm.stats.history.append((dt, comm.stats.collective_s - before[0],
                                       comm.stats.bubble_s - before[1]))
        return result

    # -- observability -------------------------------------------------------------------

    def expert_tokens(self) -> dict[tuple[int, int], int]:
        """(global layer, expert) -> (token, slot) pairs routed there, for this rank's layers."""
        out: dict[tuple[int, int], int] = {}
        first = self.ctx.layout.layers.start
        for i, layer in enumerate(self.model.layers):
            if isinstance(layer.mlp, ExpertParallelMoE):
                for e, n in enumerate(layer.mlp.token_counts.tolist()):
                    out[(first + i, e)] = n
        return out

    def weight_bytes(self) -> int:
        return shard_bytes(self.model)
