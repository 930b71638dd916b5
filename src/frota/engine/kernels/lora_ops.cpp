// The LoRA delta of a step's decode rows, each under its own adapter slot (punica's BGMV):
//   y[row] += (x[row] @ A[slot]) @ B_j[slot]   for every target j fused into the projection.
//
// Expressed with torch's ops (frota.engine.lora.ops), the gather path first copies each
// row's A and B out of the slot pool (index_select) and then runs a batched matmul on the
// copies: a few dozen rows times ~170 KB of adapter weights per projection per layer,
// copied every step, plus a dozen op dispatches. This kernel reads the slots in place, one
// call per projection.
//
// Rows are taken in blocks of up to four rows of one slot, so each weight read from memory
// serves four rows: with 64 decode rows over four adapters, a row-at-a-time pass read every
// adapter's A and B sixteen times per step, mostly from L3 (an adapter's share of one
// projection is up to ~0.5 MB). The blocks of a slot run one after another on one thread
// (its weights stay in that core's L2), and the threads get equal shares of the work, by
// each block's multiply-adds (the adapters' ranks and targets differ several times over).
//
// Each slot's rank per target (`ranks`, [slots, k]) bounds the work: A's columns past an
// adapter's rank, and a target it leaves out (rank 0), are zeros in the pool and are not
// read. With the pool at rank 64, a rank-8 adapter of q and v reads 3% of the qkv
// projection's A.
//
// Each output is one chain of multiply-adds over its terms in order, the same code for a
// block of one row as of four: a row's result depends on its own x, A and B alone, so a
// request's delta does not change with what it is batched beside (tests/lora/test_ops.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// Vectors of the build's widest float registers (GCC/Clang vector extensions, so that one
// source serves every ISA level the kernels are built for): the sums below are written as
// vector multiply-adds because the compiler, left to vectorize scalar loops under
// -ffast-math, vectorized across the terms instead and spilled every sum to the stack.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
constexpr int kLanes = kVecBytes / 4;
typedef float Vec __attribute__((vector_size(kVecBytes)));
typedef float VecU __attribute__((vector_size(kVecBytes), aligned(4), may_alias));  // unaligned
typedef uint16_t HalfU __attribute__((vector_size(kVecBytes / 2), aligned(2), may_alias));
typedef uint32_t Wide __attribute__((vector_size(kVecBytes)));

constexpr int kBlockRows = 4;
// Vectors per row in a tile: four rows' sums fill 8 registers (of AVX2's 16), the rest
// hold the weights and x.
constexpr int kTileVecs = 2;

// s * w + sum as one fused multiply-add where the ISA has one, written out: under
// -ffast-math the compiler fused some of these loops and not others (a block of one row
// and one of four then differed in the last bit).
inline Vec fma(Vec s, Vec w, Vec sum) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(s, w, sum);
#elif defined(__FMA__) && defined(__AVX__)
  return _mm256_fmadd_ps(s, w, sum);
#else
  return sum + s * w;  // no fused multiply-add to choose
#endif
}

inline Vec load(const float* p) { return *reinterpret_cast<const VecU*>(p); }
inline Vec load(const c10::BFloat16* p) {  // a bfloat16 is a float32's upper half
  const Wide wide = __builtin_convertvector(*reinterpret_cast<const HalfU*>(p), Wide) << 16;
  return reinterpret_cast<const Vec&>(wide);
}

// out[i][c] = sum_t coef[i][t] * mat[t * stride + c] for R rows and V vectors of columns,
// the sums in registers, each one chain over t in order. Each weight read serves R rows.
// kPartial: a last tile of `cols` < kLanes columns (V = 1), its weights copied into a
// zero-padded vector.
template <int R, int V, bool kPartial, typename W>
inline void tile(float* const* out, int64_t c, const float* const* coef, int64_t terms, const W* mat,
                 int64_t stride, int cols = 0) {
  Vec sum[R][V] = {};
  for (int64_t t = 0; t < terms; ++t) {
    const W* m = mat + t * stride + c;
    Vec w[V];
    if constexpr (!kPartial) {
      for (int v = 0; v < V; ++v) w[v] = load(m + v * kLanes);
    } else {
      float padded[kLanes] = {};
      for (int k = 0; k < cols; ++k) padded[k] = as_float(m[k]);
      w[0] = load(padded);
    }
    for (int i = 0; i < R; ++i) {
      const Vec s = Vec{} + coef[i][t];
      for (int v = 0; v < V; ++v) sum[i][v] = fma(s, w[v], sum[i][v]);
    }
  }
  for (int i = 0; i < R; ++i) {
    if constexpr (!kPartial) {
      for (int v = 0; v < V; ++v) *reinterpret_cast<VecU*>(out[i] + c + v * kLanes) = sum[i][v];
    } else {
      const float* lanes = reinterpret_cast<const float*>(&sum[i][0]);
      for (int k = 0; k < cols; ++k) out[i][c + k] = lanes[k];
    }
  }
}

// out[i][0:width] = coef[i][0:terms] @ mat[0:terms, 0:width] (rows `stride` apart) for R
// rows. Every column goes through the same multiply-adds whatever tile holds it, so a row's
// sums are the same bits in a block of one row as of four.
template <int R, typename W>
void block_mat(float* const* out, const float* const* coef, int64_t terms, const W* mat, int64_t stride,
               int64_t width) {
  int64_t c = 0;
  for (; c + kTileVecs * kLanes <= width; c += kTileVecs * kLanes)
    tile<R, kTileVecs, false>(out, c, coef, terms, mat, stride);
  for (; c + kLanes <= width; c += kLanes) tile<R, 1, false>(out, c, coef, terms, mat, stride);
  if (c < width) tile<R, 1, true>(out, c, coef, terms, mat, stride, static_cast<int>(width - c));
}

template <typename W>
void rows_mat(int rows, float* const* out, const float* const* coef, int64_t terms, const W* mat,
              int64_t stride, int64_t width) {
  switch (rows) {
    case 4: return block_mat<4>(out, coef, terms, mat, stride, width);
    case 3: return block_mat<3>(out, coef, terms, mat, stride, width);
    case 2: return block_mat<2>(out, coef, terms, mat, stride, width);
    default: return block_mat<1>(out, coef, terms, mat, stride, width);
  }
}

// A block: up to kBlockRows rows of one slot, as positions in the slot-sorted row order.
struct Block {
  int64_t first, count, slot;
};

template <typename X, typename W>
void lora_rows(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const std::vector<at::Tensor>& b,
               const std::vector<int64_t>& offsets, const at::Tensor& ranks, const at::Tensor& rows,
               const at::Tensor& slots) {
  const int64_t in_features = a.size(1), rank = b[0].size(1), fused = a.size(2), num_slots = a.size(0);
  const int64_t targets = static_cast<int64_t>(b.size()), n = rows.numel();
  std::vector<int64_t> widths;
  std::vector<const W*> b_data;
  int64_t widest = 0;
  for (const auto& t : b) {
    widths.push_back(t.size(2));
    b_data.push_back(t.data_ptr<W>());
    widest = std::max(widest, t.size(2));
  }
  const int64_t* row_of = rows.data_ptr<int64_t>();
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  const int64_t* rank_of = ranks.data_ptr<int64_t>();

  // rows by slot (a stable counting sort), then blocks of up to kBlockRows rows of one slot,
  // each with its multiply-adds (per row: r_j * (in + width_j) for each target j)
  std::vector<int64_t> start(num_slots + 1, 0), order(n);
  for (int64_t i = 0; i < n; ++i) ++start[slot_of[i] + 1];
  for (int64_t s = 0; s < num_slots; ++s) start[s + 1] += start[s];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) order[next[slot_of[i]]++] = row_of[i];
  std::vector<Block> blocks;
  std::vector<int64_t> work{0};  // work[k]: the multiply-adds of blocks[0:k]
  for (int64_t s = 0; s < num_slots; ++s) {
    int64_t per_row = 0;
    for (int64_t j = 0; j < targets; ++j) per_row += rank_of[s * targets + j] * (in_features + widths[j]);
    for (int64_t first = start[s]; first < start[s + 1]; first += kBlockRows) {
      const int64_t count = std::min<int64_t>(kBlockRows, start[s + 1] - first);
      if (per_row == 0) continue;  // every target left out: no delta
      blocks.push_back({first, count, s});
      work.push_back(work.back() + count * per_row);
    }
  }
  if (blocks.empty()) return;

  X* y_data = y.data_ptr<X>();
  const X* x_data = x.data_ptr<X>();
  const W* a_data = a.data_ptr<W>();
  const int64_t y_stride = y.stride(0), x_stride = x.stride(0);
  auto run_blocks = [&](int64_t begin, int64_t end) {
    std::vector<float> xf(kBlockRows * in_features), xa(kBlockRows * rank), acc(kBlockRows * widest);
    float *xf_row[kBlockRows], *xa_row[kBlockRows], *acc_row[kBlockRows];
    for (int i = 0; i < kBlockRows; ++i) {
      xf_row[i] = xf.data() + i * in_features;
      xa_row[i] = xa.data() + i * rank;
      acc_row[i] = acc.data() + i * widest;
    }
    for (int64_t k = begin; k < end; ++k) {
      const Block& block = blocks[k];
      const int count = static_cast<int>(block.count);
      for (int i = 0; i < count; ++i) {
        const X* src = x_data + order[block.first + i] * x_stride;
        for (int64_t h = 0; h < in_features; ++h) xf_row[i][h] = as_float(src[h]);
      }
      const W* a_slot = a_data + block.slot * in_features * fused;
      for (int64_t j = 0; j < targets; ++j) {
        const int64_t r = rank_of[block.slot * targets + j], width = widths[j];
        if (r == 0) continue;
        rows_mat(count, xa_row, xf_row, in_features, a_slot + j * rank, fused, r);
        rows_mat(count, acc_row, xa_row, r, b_data[j] + block.slot * rank * width, width, width);
        for (int i = 0; i < count; ++i) {
          X* out = y_data + order[block.first + i] * y_stride + offsets[j];
          for (int64_t c = 0; c < width; ++c) out[c] = static_cast<X>(as_float(out[c]) + acc_row[i][c]);
        }
      }
    }
  };
  // One contiguous run of blocks per thread, the runs cut where the work is even.
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(blocks.size()));
  const int64_t total = work.back();
  at::parallel_for(0, threads, 1, [&](int64_t t_begin, int64_t t_end) {
    auto cut = [&](int64_t t) {  // the first block of thread t's run
      return static_cast<int64_t>(std::lower_bound(work.begin(), work.end() - 1, total * t / threads) - work.begin());
    };
    run_blocks(cut(t_begin), t_end == threads ? static_cast<int64_t>(blocks.size()) : cut(t_end));
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
