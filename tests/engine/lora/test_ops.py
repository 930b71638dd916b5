"""The LoRA delta's two decode paths compute the same thing: the C++ gather kernel
(`lora_ops.cpp`, the CPU's default) and the torch gather it replaces (`FROTA_CPU_KERNELS=0`,
and every other device).

The reference here is float64 math on the same weights; each check names the path that ran.
"""

from __future__ import annotations

import pytest
import torch

from frota.engine import kernels
from frota.engine.lora import ops
from frota.engine.lora.batch import build_batch
from frota.engine.lora.slots import SlotProjection

HIDDEN, WIDTHS, SLOTS, RANK = 96, [96, 32, 32], 4, 8
# dtype (of activations and slots alike) -> the largest error allowed, relative to the
# delta's largest magnitude: float32's sums over ~100 terms; bfloat16's rounding of the
# output (2^-8) and, on the torch path, of x @ A before it meets B.
CASES = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def projection(dtype: torch.dtype) -> SlotProjection:
    proj = SlotProjection("qkv_proj", HIDDEN, WIDTHS, SLOTS, RANK, dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    proj.a.copy_(torch.randn(proj.a.shape, generator=generator))
    for b in proj.b:
        b.copy_(torch.randn(b.shape, generator=generator))
    # slot 3 holds a rank-3 adapter in the rank-8 pool: its padding stays zero
    for j in range(len(WIDTHS)):
        proj.a[3, :, j * RANK + 3:(j + 1) * RANK] = 0
        proj.b[j][3, 3:] = 0
    # slot 1's adapter leaves the second target (k) out: zeros, rank 0
    proj.a[1, :, RANK:2 * RANK] = 0
    proj.b[1][1] = 0
    for slot in range(SLOTS):
        for j in range(len(WIDTHS)):
            proj.set_rank(slot, j, 3 if slot == 3 else 0 if (slot, j) == (1, 1) else RANK)
    return proj


def reference(y: torch.Tensor, x: torch.Tensor, proj: SlotProjection,
              rows: list[tuple[int, int | None]]) -> torch.Tensor:
    out = y.double().clone()
    for row, slot in rows:
        if slot is None:
            continue
        xa = x[row].double() @ proj.a[slot].double()
        for j, (offset, b) in enumerate(zip(proj.offsets, proj.b, strict=True)):
            out[row, offset:offset + b.shape[2]] += xa[j * RANK:(j + 1) * RANK] @ b[slot].double()
    return out


def paths() -> list[str]:
    return ["kernel", "torch"] if kernels.cpu_kernels() is not None else ["torch"]


def run(path: str, y: torch.Tensor, x: torch.Tensor, proj: SlotProjection, rows, monkeypatch):
    if path == "torch":
        monkeypatch.setattr(ops, "gather_kernel", lambda x, proj: None)
    else:
        assert ops.gather_kernel(x, proj) is not None
    batch = build_batch([(row, 1, slot) for row, slot in rows], x.device)
    assert batch is not None and not batch.segments
    return ops.add_lora(y, x, proj, batch)


@pytest.mark.parametrize("path", paths())
@pytest.mark.parametrize("dtype", list(CASES), ids=str)
def test_decode_rows_get_their_own_slots_delta_and_base_rows_stay_untouched(path, dtype, monkeypatch):
    proj = projection(dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(7, HIDDEN, generator=generator).to(dtype)
    y = torch.randn(7, sum(WIDTHS), generator=generator).to(dtype)
    rows = [(0, 2), (1, None), (2, 0), (3, 2), (4, 3), (5, None), (6, 1)]
    expected = reference(y, x, proj, rows)
    base_rows = y[[1, 5]].clone()
    out = run(path, y.clone(), x, proj, rows, monkeypatch)
    where = f"path {path}, {dtype}"
    assert torch.equal(out[[1, 5]], base_rows), f"{where}: a base-model row changed"
    scale = (expected - y.double()).abs().max().item()
    error = (out.double() - expected).abs().max().item()
    assert error <= CASES[dtype] * scale, f"{where}: error {error:.3g} vs delta scale {scale:.3g}"


@pytest.mark.parametrize("path", paths())
def test_a_rows_delta_is_the_same_bits_batched_or_alone(path, monkeypatch):
    proj = projection(torch.float32)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(11, HIDDEN, generator=generator)
    y = torch.randn(11, sum(WIDTHS), generator=generator)
    # slot 1's five rows make a block of four and one of one; slot 3's rank 3 a partial tile
    rows = [(0, 1), (1, 0), (2, 1), (3, 3), (4, 2), (5, 1), (6, 3), (7, 1), (8, 1), (9, 3), (10, 0)]
    batched = run(path, y.clone(), x, proj, rows, monkeypatch)
    for row, slot in rows:
        alone = run(path, y[row:row + 1].clone(), x[row:row + 1], proj, [(0, slot)], monkeypatch)
        assert torch.equal(alone[0], batched[row]), f"path {path}: row {row} differs batched"


def test_the_kernel_refuses_rows_outside_the_batch_instead_of_reading_past_it():
    kernel = kernels.cpu_kernels()
    if kernel is None:
        pytest.skip("the C++ kernels are off or cannot be built here (FROTA_CPU_KERNELS=0)")
    proj = projection(torch.float32)
    x, y = torch.randn(2, HIDDEN), torch.zeros(2, sum(WIDTHS))
    for rows, slots in (([2], [0]), ([0], [SLOTS])):
        with pytest.raises(RuntimeError, match="out of range"):
            kernel.lora_gather(y, x, proj.a, proj.b, proj.offsets, proj.ranks, torch.tensor(rows),
                               torch.tensor(slots))
    bad = proj.ranks.clone()
    bad[0, 0] = RANK + 1
    with pytest.raises(RuntimeError, match="rank"):
        kernel.lora_gather(y, x, proj.a, proj.b, proj.offsets, bad, torch.tensor([0]), torch.tensor([0]))
    assert not y.any()


@pytest.mark.parametrize("dtype", list(CASES), ids=str)
def test_prefill_segments_get_their_slots_delta_over_its_own_ranks(dtype):
    proj = projection(dtype)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(9, HIDDEN, generator=generator).to(dtype)
    y = torch.randn(9, sum(WIDTHS), generator=generator).to(dtype)
    # chunks of 3 rows under slot 3 (rank 3), 2 base rows, 4 rows under slot 1 (k left out)
    batch = build_batch([(0, 3, 3), (3, 2, None), (5, 4, 1)], x.device)
    assert batch is not None and batch.segments and batch.decode_rows is None
    expected = reference(y, x, proj, [(r, 3) for r in range(3)] + [(r, 1) for r in range(5, 9)])
    out = ops.add_lora(y.clone(), x, proj, batch)
    assert torch.equal(out[3:5], y[3:5]), f"{dtype}: a base-model row changed"
    scale = (expected - y.double()).abs().max().item()
    error = (out.double() - expected).abs().max().item()
    assert error <= CASES[dtype] * scale, f"segments, {dtype}: error {error:.3g} vs scale {scale:.3g}"


def test_a_slot_written_from_an_adapter_records_its_rank_per_target():
    from frota.engine.lora.slots import ShardRanges, SlotPool

    proj = SlotProjection("qkv_proj", HIDDEN, WIDTHS, SLOTS, RANK, torch.float32, torch.device("cpu"))
    pool = SlotPool({(0, "qkv_proj"): proj}, range(1), SLOTS,
                    ShardRanges(q=(0, WIDTHS[0]), kv=(0, WIDTHS[1]), ff=(0, 0)))

    from types import SimpleNamespace

    # what the pool reads of a LoadedAdapter: (layer, target) -> (A [in, r], B [r, out])
    adapter = SimpleNamespace(weights={(0, "q_proj"): (torch.ones(HIDDEN, 5), torch.ones(5, WIDTHS[0])),
                                       (0, "v_proj"): (torch.ones(HIDDEN, 2), torch.ones(2, WIDTHS[2]))})
    pool.write(2, adapter)
    assert proj.ranks[2].tolist() == [5, 0, 2] and proj.slot_ranks[2] == [5, 0, 2]
    pool.write(2, SimpleNamespace(weights={}))  # rewritten: nothing left of the old one
    assert proj.ranks[2].tolist() == [0, 0, 0] and not proj.a[2].any()
