// The LoRA delta of a step's decode rows, each under its own adapter slot (punica's BGMV):
//   y[row] += (x[row] @ A[slot]) @ B_j[slot]   for every target j fused into the projection.
//
// Expressed with torch's ops (frota.engine.lora.ops), the gather path first copies each
// row's A and B out of the slot pool (index_select) and then runs a batched matmul on the
// copies: at decode, a few dozen rows times ~170 KB of adapter weights per projection per
// layer, copied every step, plus a dozen op dispatches. Measured on SmolLM2's qkv
// projection (bench/lora_ops.py) that costs 2-3x the base projection itself. This kernel
// reads the slots in place: one call per projection, rows in parallel, float32 sums.
// (Blocking rows of one slot together, to read each weight once for several, measured
// slower here: the sums of several rows no longer fit the registers.)
//
// Each slot's rank per target (`ranks`, [slots, k]) bounds the work: A's columns past an
// adapter's rank, and a target it leaves out (rank 0), are zeros in the pool and are not
// read. With the pool at rank 64, a rank-8 adapter of q and v reads 3% of the qkv
// projection's A. Skipping them leaves every other sum as it was, term for term.
//
// Each row's result depends on its own x, A and B alone (no cross-row reduction), so a
// request's delta does not change with what it is batched beside.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// out[c] = sum_t coef[t] * mat[t * stride + c] for N columns, the sums held in registers
// (N a constant: the compiler unrolls and vectorizes the column loop). Even and odd terms
// go to separate sums, so two chains of multiply-adds overlap instead of waiting on each
// other's latency; the order is fixed, whatever the batch. With kSkipZeros a pair of zero
// coefficients skips its rows of `mat`: a rank below the pool's, a target left out.
template <int N, bool kSkipZeros, typename W>
inline void block(float* out, const float* coef, int64_t terms, const W* mat, int64_t stride) {
  float even[N] = {}, odd[N] = {};
  int64_t t = 0;
  for (; t + 2 <= terms; t += 2) {
    const float s0 = coef[t], s1 = coef[t + 1];
    if (kSkipZeros && s0 == 0.f && s1 == 0.f) continue;
    const W* m0 = mat + t * stride;
    const W* m1 = m0 + stride;
    for (int k = 0; k < N; ++k) {
      even[k] += s0 * as_float(m0[k]);
      odd[k] += s1 * as_float(m1[k]);
    }
  }
  if (t < terms) {
    const float s0 = coef[t];
    const W* m0 = mat + t * stride;
    for (int k = 0; k < N; ++k) even[k] += s0 * as_float(m0[k]);
  }
  for (int k = 0; k < N; ++k) out[k] = even[k] + odd[k];
}

// out[0:width] = coef[0:terms] @ mat[0:terms, 0:width] (rows `stride` apart), in column
// blocks of at most 32: two sets of 32 sums fill half of AVX2's 16 registers.
template <bool kSkipZeros, typename W>
void vec_mat(float* out, const float* coef, int64_t terms, const W* mat, int64_t stride, int64_t width) {
  int64_t c = 0;
  for (; c + 32 <= width; c += 32) block<32, kSkipZeros>(out + c, coef, terms, mat + c, stride);
  for (; c + 16 <= width; c += 16) block<16, kSkipZeros>(out + c, coef, terms, mat + c, stride);
  for (; c + 8 <= width; c += 8) block<8, kSkipZeros>(out + c, coef, terms, mat + c, stride);
  for (; c < width; ++c) block<1, kSkipZeros>(out + c, coef, terms, mat + c, stride);
}

// One row: per target j of rank r_j (0: left out), xa_j = x @ A[:, j*R : j*R + r_j], then
// y[offset_j:] += xa_j @ B_j[:r_j].
template <typename X, typename W>
void lora_row(X* y, const X* x, const W* a, const std::vector<const W*>& b,
              const std::vector<int64_t>& widths, const std::vector<int64_t>& offsets, const int64_t* ranks,
              int64_t in_features, int64_t rank, float* xf, float* xa, float* acc) {
  const int64_t fused = rank * static_cast<int64_t>(b.size());
  for (int64_t h = 0; h < in_features; ++h) xf[h] = as_float(x[h]);
  for (size_t j = 0; j < b.size(); ++j) {
    const int64_t r = ranks[j], width = widths[j];
    if (r == 0) continue;
    vec_mat<false>(xa + j * rank, xf, in_features, a + j * rank, fused, r);
    vec_mat<true>(acc, xa + j * rank, r, b[j], width, width);
    X* out = y + offsets[j];
    for (int64_t c = 0; c < width; ++c) out[c] = static_cast<X>(as_float(out[c]) + acc[c]);
  }
}

template <typename X, typename W>
void lora_rows(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const std::vector<at::Tensor>& b,
               const std::vector<int64_t>& offsets, const at::Tensor& ranks, const at::Tensor& rows,
               const at::Tensor& slots) {
  const int64_t in_features = a.size(1), rank = b[0].size(1);
  std::vector<int64_t> widths;
  int64_t widest = 0;
  for (const auto& t : b) {
    widths.push_back(t.size(2));
    widest = std::max(widest, t.size(2));
  }
  const int64_t* row_of = rows.data_ptr<int64_t>();
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  const int64_t* rank_of = ranks.data_ptr<int64_t>();
  const int64_t targets = static_cast<int64_t>(b.size());
  X* y_data = y.data_ptr<X>();
  const X* x_data = x.data_ptr<X>();
  const W* a_data = a.data_ptr<W>();
  const int64_t fused = a.size(2), y_stride = y.stride(0), x_stride = x.stride(0);
  at::parallel_for(0, rows.numel(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(in_features), xa(fused), acc(widest);
    std::vector<const W*> b_slot(b.size());
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = row_of[i], slot = slot_of[i];
      for (size_t j = 0; j < b.size(); ++j) b_slot[j] = b[j].data_ptr<W>() + slot * rank * widths[j];
      lora_row<X, W>(y_data + row * y_stride, x_data + row * x_stride, a_data + slot * in_features * fused,
                     b_slot, widths, offsets, rank_of + slot * targets, in_features, rank, xf.data(), xa.data(),
                     acc.data());
    }
  });
}

}  // namespace

// y [T, out] (in place) += each listed row's delta under its slot. x [T, in]; A [slots, in,
// k * R]; B_j [slots, R, width_j], writing y's columns offsets[j]...; ranks int64 [slots, k],
// each at most R; rows and slots int64 [n]. x, y, A and B share a dtype: float32 or bfloat16
// (the slot pool is allocated in the model's).
void lora_gather(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const std::vector<at::Tensor>& b,
                 const std::vector<int64_t>& offsets, const at::Tensor& ranks, const at::Tensor& rows,
                 const at::Tensor& slots) {
  TORCH_CHECK(!b.empty() && b.size() == offsets.size(), "one offset per B");
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && y.size(0) == x.size(0) && y.stride(1) == 1 && x.stride(1) == 1,
              "x and y must be [tokens, width] with contiguous rows");
  TORCH_CHECK(a.dim() == 3 && a.is_contiguous() && a.size(1) == x.size(1), "A must be a contiguous [slots, in, k*R]");
  TORCH_CHECK(a.size(2) == b[0].size(1) * static_cast<int64_t>(b.size()), "A's width is the ranks of every B");
  for (size_t j = 0; j < b.size(); ++j) {
    TORCH_CHECK(b[j].dim() == 3 && b[j].is_contiguous() && b[j].size(0) == a.size(0) && b[j].size(1) == b[0].size(1),
                "each B must be a contiguous [slots, R, width]");
    TORCH_CHECK(b[j].scalar_type() == a.scalar_type(), "A and B must share a dtype");
    TORCH_CHECK(offsets[j] >= 0 && offsets[j] + b[j].size(2) <= y.size(1), "B's columns must lie in y");
  }
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "x and y must share a dtype");
  TORCH_CHECK(ranks.scalar_type() == at::kLong && ranks.is_contiguous() && ranks.dim() == 2 &&
                  ranks.size(0) == a.size(0) && ranks.size(1) == static_cast<int64_t>(b.size()),
              "ranks must be a contiguous int64 [slots, targets]");
  const int64_t* rank_data = ranks.data_ptr<int64_t>();
  for (int64_t i = 0; i < ranks.numel(); ++i)
    TORCH_CHECK(rank_data[i] >= 0 && rank_data[i] <= b[0].size(1), "a slot's rank ", rank_data[i],
                " is outside 0..", b[0].size(1));
  TORCH_CHECK(rows.scalar_type() == at::kLong && slots.scalar_type() == at::kLong && rows.is_contiguous() &&
                  slots.is_contiguous() && rows.numel() == slots.numel(),
              "rows and slots must be int64 vectors of one length");
  const int64_t* row_of = rows.data_ptr<int64_t>();
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    TORCH_CHECK(row_of[i] >= 0 && row_of[i] < y.size(0) && slot_of[i] >= 0 && slot_of[i] < a.size(0),
                "row ", row_of[i], " or slot ", slot_of[i], " out of range");
  const auto xt = x.scalar_type(), wt = a.scalar_type();
  if (xt == at::kFloat && wt == at::kFloat) return lora_rows<float, float>(y, x, a, b, offsets, ranks, rows, slots);
  if (xt == at::kBFloat16 && wt == at::kBFloat16)
    return lora_rows<c10::BFloat16, c10::BFloat16>(y, x, a, b, offsets, ranks, rows, slots);
  TORCH_CHECK(false, "lora_gather runs float32 or bfloat16 activations and adapters of the same dtype");
}
