// Paged decode attention on AVX-512, for head sizes 64 and 128: the path paged_attention.cpp
// takes where this build has AVX-512 (other builds and head sizes keep its portable loops).
//
// A decode step's attention reads every cached K and V row of every sequence once, so it
// should run at the memory's speed. The portable loops ran at half of it on a 2-core Xeon VM
// (AMX, 16 GB/s of random 2 KB reads): each key's score ended in a horizontal sum of its own,
// and V's rows were summed one chain of FMAs at a time. Here:
//
// - A task is one sequence with all of its KV heads, whose rows of a block are contiguous in
//   the pool, so each block is one run of memory; the next block is prefetched while one is
//   used (blocks sit anywhere in the pool, out of the hardware prefetcher's sight). With too
//   few sequences to keep every thread busy, a sequence's KV heads are split over tasks.
//   Tasks are handed out one at a time from a shared counter, so sequences of different
//   lengths do not leave a thread idle at the end of a static split.
// - Pass 1 scores a tile of 16 keys against one query head in one vector: each key's dot
//   products (vdpbf16ps on bfloat16 rows where the build has AVX-512 BF16, FMAs on widened
//   rows otherwise) are summed across lanes for all 16 keys at once (transpose_sum16).
// - Softmax runs over each head's whole row of scores, in float32.
// - Pass 2 widens a tile's V rows to float32 once for the KV head's group and adds them into
//   each query head's output, kept in registers, several rows at a time into separate
//   accumulators (one chain of FMAs would wait out each FMA's latency).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(__AVX512F__)
#include "simd.h"

namespace {

using frota_simd::exp_nonpositive;
using frota_simd::kMasked;
using frota_simd::transpose_slot;
using frota_simd::transpose_sum16;

constexpr int kTile = 16;           // keys per tile: one vector of scores per query head

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) { return frota_simd::widen_bf16(reinterpret_cast<const uint16_t*>(p)); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One query head's row, ready to be dotted with key rows: widened to float32.
template <typename T, int DIM>
struct Query {
  __m512 q[DIM / 16];
  void load(const T* row) {
    for (int j = 0; j < DIM / 16; ++j) q[j] = load16(row + 16 * j);
  }
  // The 16 lanes whose sum is the row's dot product with `key`.
  __m512 dot(const T* key) const {
    __m512 acc = _mm512_mul_ps(q[0], load16(key));
    for (int j = 1; j < DIM / 16; ++j) acc = _mm512_fmadd_ps(q[j], load16(key + 16 * j), acc);
    return acc;
  }
};

#if defined(__AVX512BF16__)
// bfloat16 with AVX-512 BF16: vdpbf16ps multiplies pairs exactly and sums them in float32,
// straight off the cache rows.
template <int DIM>
struct Query<c10::BFloat16, DIM> {
  __m512bh q[DIM / 32];
  void load(const c10::BFloat16* row) {
    for (int j = 0; j < DIM / 32; ++j) q[j] = (__m512bh)_mm512_loadu_si512(row + 32 * j);
  }
  __m512 dot(const c10::BFloat16* key) const {
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < DIM / 32; ++j) acc = _mm512_dpbf16_ps(acc, q[j], (__m512bh)_mm512_loadu_si512(key + 32 * j));
    return acc;
  }
};
#endif

// The scores of one query head against a tile's first n keys (rows of DIM), lane r for key r.
template <typename T, int DIM>
inline __m512 tile_scores(const Query<T, DIM>& query, const T* keys, int n) {
  __m512 dots[kTile];
  for (int r = 0; r < kTile; ++r) dots[transpose_slot(r)] = r < n ? query.dot(keys + r * DIM) : _mm512_setzero_ps();
  return transpose_sum16(dots);
}

// Ask for the next block's rows while this one is used: blocks sit anywhere in the pool, so
// the hardware prefetcher cannot see the next one coming.
template <typename T>
inline void prefetch_rows(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// What one task reads and writes: one sequence's KV heads [kv_begin, kv_end).
template <typename T>
struct Task {
  const T* q;            // the sequence's query rows [heads, DIM]
  const int32_t* table;  // its block table
  int64_t context;       // its tokens with KV
  int64_t kv_begin, kv_end;
  T* out;                // its output rows [heads, DIM]
};

template <typename T, int DIM>
class Attention {
 public:
  Attention(const T* k_cache, const T* v_cache, int64_t heads, int64_t kv_heads, int64_t block_size, float scale)
      : k_cache_(k_cache), v_cache_(v_cache), group_(heads / kv_heads), block_size_(block_size),
        block_stride_(kv_heads * block_size * DIM), scale_(scale), queries_(heads), sum_(heads), rows_(kTile * DIM) {}

  void run(const Task<T>& task) {
    const int64_t kv_count = task.kv_end - task.kv_begin, heads = kv_count * group_;
    const int64_t width = (task.context + kTile - 1) / kTile * kTile;  // a row of scores_, whole tiles
    for (int64_t h = 0; h < heads; ++h) queries_[h].load(task.q + (task.kv_begin * group_ + h) * DIM);
    scores_.resize(heads * width);
    // The task's rows of a block: its KV heads' rows are contiguous, [kv head][slot][DIM].
    const int64_t head_rows = block_size_ * DIM, span = kv_count * head_rows;
    const int64_t num_blocks = (task.context + block_size_ - 1) / block_size_;
    const auto block = [&](const T* cache, int64_t blk) {
      return cache + task.table[blk] * block_stride_ + task.kv_begin * head_rows;
    };
    // Pass 1: every key's score for every query head, and each head's max.
    __m512 top[kMaxHeads];
    for (int64_t h = 0; h < heads; ++h) top[h] = _mm512_set1_ps(kMasked);
    const __m512 scale = _mm512_set1_ps(scale_), masked = _mm512_set1_ps(kMasked);
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      if (blk + 1 < num_blocks) prefetch_rows(block(k_cache_, blk + 1), span);
      const T* keys = block(k_cache_, blk);
      for_each_tile(task.context, blk, [&](int64_t t0, int n) {
        const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
        for (int64_t h = 0; h < heads; ++h) {
          const T* rows = keys + h / group_ * head_rows + t0 * DIM;
          const __m512 s = _mm512_mask_mul_ps(masked, valid, tile_scores(queries_[h], rows, n), scale);
          top[h] = _mm512_max_ps(top[h], s);
          _mm512_mask_storeu_ps(scores_.data() + h * width + blk * block_size_ + t0, valid, s);
        }
      });
    }
    // Softmax, unnormalized: scores_ becomes exp(score - max); the outputs are divided by the
    // sums at the end.
    for (int64_t h = 0; h < heads; ++h) {
      const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top[h]));
      __m512 sum = _mm512_setzero_ps();
      float* row = scores_.data() + h * width;
      for (int64_t t = 0; t < width; t += kTile) {
        const int64_t left = task.context - t;
        const __mmask16 valid = left >= kTile ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
        const __m512 e = _mm512_maskz_mov_ps(valid, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + t), m)));
        sum = _mm512_add_ps(sum, e);
        _mm512_storeu_ps(row + t, e);
      }
      sum_[h] = _mm512_reduce_add_ps(sum);
    }
    // Pass 2: the weighted sum of the values, each query head's output row in registers while
    // a tile's rows (widened once for the group) stream past.
    constexpr int V = DIM / 16;
    std::vector<__m512>& acc = acc_;
    acc.assign(heads * V, _mm512_setzero_ps());
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      if (blk + 1 < num_blocks) prefetch_rows(block(v_cache_, blk + 1), span);
      const T* values = block(v_cache_, blk);
      for_each_tile(task.context, blk, [&](int64_t t0, int n) {
        for (int64_t kv = 0; kv < kv_count; ++kv) {
          const float* rows = widen_tile(values + kv * head_rows + t0 * DIM, n);
          for (int64_t h = kv * group_; h < (kv + 1) * group_; ++h)
            add_rows(acc.data() + h * V, scores_.data() + h * width + blk * block_size_ + t0, rows, n);
        }
      });
    }
    T* out = task.out + task.kv_begin * group_ * DIM;
    for (int64_t h = 0; h < heads; ++h) {
      alignas(64) float row[DIM];
      const __m512 inv = _mm512_set1_ps(1.f / sum_[h]);
      for (int j = 0; j < V; ++j) _mm512_store_ps(row + 16 * j, _mm512_mul_ps(acc[h * V + j], inv));
      for (int d = 0; d < DIM; ++d) out[h * DIM + d] = static_cast<T>(row[d]);
    }
  }

  static constexpr int64_t kMaxHeads = 256;  // query heads per task

 private:
  // f(t0, n) for each tile of block `blk`: its first slot and how many of its keys are in
  // the context (1-16).
  template <typename F>
  void for_each_tile(int64_t context, int64_t blk, F&& f) const {
    for (int64_t t0 = 0; t0 < block_size_; t0 += kTile) {
      const int64_t left = std::min(block_size_ - t0, context - blk * block_size_ - t0);
      if (left <= 0) return;
      f(t0, static_cast<int>(std::min<int64_t>(kTile, left)));
    }
  }

  // acc (a row of DIM / 16 vectors) += sum over r < n of p[r] * rows[r]. kChains rows at a
  // time, each into its own accumulators: one chain of FMAs would wait out each FMA's latency.
  static void add_rows(__m512* acc, const float* p, const float* rows, int n) {
    constexpr int V = DIM / 16, kChains = DIM <= 64 ? 4 : 2;
    __m512 a[kChains][V];
    for (int j = 0; j < V; ++j) {
      a[0][j] = acc[j];
      for (int c = 1; c < kChains; ++c) a[c][j] = _mm512_setzero_ps();
    }
    int r = 0;
    for (; r + kChains <= n; r += kChains)
      for (int c = 0; c < kChains; ++c) {
        const __m512 pr = _mm512_set1_ps(p[r + c]);
        for (int j = 0; j < V; ++j) a[c][j] = _mm512_fmadd_ps(pr, _mm512_loadu_ps(rows + (r + c) * DIM + 16 * j), a[c][j]);
      }
    for (; r < n; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r]);
      for (int j = 0; j < V; ++j) a[0][j] = _mm512_fmadd_ps(pr, _mm512_loadu_ps(rows + r * DIM + 16 * j), a[0][j]);
    }
    for (int j = 0; j < V; ++j) {
      __m512 sum = a[0][j];
      for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, a[c][j]);
      acc[j] = sum;
    }
  }

  // The tile's n value rows as float32: the cache rows themselves, or widened into rows_.
  const float* widen_tile(const T* values, int n) {
    if constexpr (std::is_same_v<T, float>) {
      return values;
    } else {
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < DIM / 16; ++j)
          _mm512_storeu_ps(rows_.data() + r * DIM + 16 * j, load16(values + r * DIM + 16 * j));
      return rows_.data();
    }
  }

  const T* k_cache_;
  const T* v_cache_;
  int64_t group_, block_size_, block_stride_;
  float scale_;
  std::vector<Query<T, DIM>> queries_;  // per query head
  std::vector<float> sum_, rows_, scores_;
  std::vector<__m512> acc_;
};

template <typename T, int DIM>
void decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables, const int32_t* context_lens, T* out,
            int64_t batch, int64_t heads, int64_t kv_heads, int64_t block_size, int64_t max_blocks, float scale) {
  // A task is a sequence and all of its KV heads, whose rows of a block are contiguous, so
  // each block is one run of memory; with too few sequences to keep every thread busy, a
  // sequence's KV heads are split over several tasks.
  const int64_t threads = at::get_num_threads();
  const int64_t splits = std::min(kv_heads, std::max<int64_t>(1, 4 * threads / std::max<int64_t>(1, batch)));
  const int64_t per_task = (kv_heads + splits - 1) / splits, tasks = batch * splits;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, tasks), 1, [&](int64_t, int64_t) {
    // One per thread: its buffers are reused task after task.
    Attention<T, DIM> attention(k_cache, v_cache, heads, kv_heads, block_size, scale);
    for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      const int64_t b = task / splits, kv_begin = task % splits * per_task;
      const int64_t kv_end = std::min(kv_heads, kv_begin + per_task);
      if (kv_begin >= kv_end) continue;
      if (context_lens[b] <= 0) {  // nothing to attend to: a zero output, never a read
        T* rows = out + b * heads * DIM;
        std::fill(rows + kv_begin * (heads / kv_heads) * DIM, rows + kv_end * (heads / kv_heads) * DIM, T(0));
        continue;
      }
      attention.run({q + b * heads * DIM, tables + b * max_blocks, context_lens[b], kv_begin, kv_end,
                     out + b * heads * DIM});
    }
  });
}

template <typename T>
bool decode_any(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables, const int32_t* context_lens,
                T* out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t block_size, int64_t dim,
                int64_t max_blocks, float scale) {
  if (heads > Attention<T, 64>::kMaxHeads) return false;
  if (dim == 64) {
    decode<T, 64>(q, k_cache, v_cache, tables, context_lens, out, batch, heads, kv_heads, block_size, max_blocks, scale);
  } else if (dim == 128) {
    decode<T, 128>(q, k_cache, v_cache, tables, context_lens, out, batch, heads, kv_heads, block_size, max_blocks, scale);
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool paged_decode_attention_avx512(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& tables, const at::Tensor& lens, at::Tensor& out, double scale) {
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention_avx512", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      done = decode_any<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                                  tables.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(),
                                  q.size(0), q.size(1), k_cache.size(1), k_cache.size(2), q.size(2), tables.size(1),
                                  static_cast<float>(scale));
    }
  });
  return done;
}

#else  // no AVX-512 in this build: the portable loops run

bool paged_decode_attention_avx512(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, at::Tensor&, double) {
  return false;
}

#endif
