// Paged decode attention for CPU: one query token per sequence, read straight out of the
// block pool through the sequence's block table. Nothing is gathered or padded: each K and V
// row is read once, in place, and every (sequence, KV head) pair is one task for
// at::parallel_for. Scores live in a per-task float buffer (two passes: scores, then a
// softmax-weighted sum of V), which for decode-sized contexts stays in L2.
//
// The loops are written for the compiler's vectorizer (-O3 -ffast-math): a K or V block is
// widened to float32 once (bfloat16 by a shift of its bits) and then used by every query head
// of its group; with head_dim fixed at compile time (64, 128) a head's running output stays
// in vector registers while the rows stream past. Where the build has AVX-512 BF16, bfloat16
// scores come straight off the cache rows through vdpbf16ps (exact products, float32 sums).
// Converting each element inside the dot product instead, the kernel read 3.3 GB/s of KV;
// this way, with the next block prefetched while one is used, float32 reads near the
// memory's bandwidth (docs/engine.md#cpu-kernels).
//
// On AVX-512 builds, head sizes 64 and 128 take decode_attention_avx512.cpp instead, written
// for those instructions; these loops serve every other build and head size.
//
// Shapes: q [B, H, D]; k_cache, v_cache [num_blocks, KVH, block_size, D];
// block_tables [B, max_blocks] int32 (rows padded past each sequence's last block);
// context_lens [B] int32. Grouped-query attention: H = KVH * G, query head h reads KV head h / G.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

// 16 floats, for the accumulators the compiler keeps in registers (AVX-512: one, AVX2: two).
typedef float f32x16 __attribute__((vector_size(64)));

constexpr int64_t kMaxHeadDim = 512;

// Ask for the next block's rows while this one is used: blocks sit anywhere in the pool, so
// the hardware prefetcher cannot see the next one coming.
template <typename T>
inline void prefetch_rows(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(c + off);
}

// `n` elements as float32: `src` itself for float, else widened into `buf` (bfloat16 by a
// shift of its bits).
template <typename T>
inline const float* widen(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(buf + i, &wide, sizeof(float));
    }
    return buf;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
}

// One (sequence, KV head) task. DIM > 0 fixes head_dim at compile time (fully unrolled
// inner loops, the query and accumulator rows in registers); DIM == 0 reads it from `dim`.
template <typename T, int DIM>
void attend(const T* q_group, const T* k_cache, const T* v_cache, const int32_t* table,
            int64_t context, T* out_group, int64_t group, int64_t block_size, int64_t dim_arg,
            int64_t block_stride, int64_t head_offset, float scale, std::vector<float>& scores,
            std::vector<float>& block, std::vector<float>& queries, std::vector<float>& outs) {
  const int64_t dim = DIM > 0 ? DIM : dim_arg;
  const int64_t num_blocks = (context + block_size - 1) / block_size;
  scores.resize(group * context);
  block.resize(block_size * dim);
  alignas(64) float acc[kMaxHeadDim];
  // Block `blk` of this sequence and KV head in `cache`; prefetching past the last is a no-op.
  const auto block_of = [&](const T* cache, int64_t blk) {
    return cache + table[blk] * block_stride + head_offset;
  };
  const auto prefetch_block = [&](const T* cache, int64_t blk) {
    if (blk < num_blocks) prefetch_rows(block_of(cache, blk), block_size * dim);
  };
#if defined(__AVX512BF16__)
  // Pass 1 on bfloat16 rows with AVX-512 BF16: dot products straight off the cache rows
  // (vdpbf16ps multiplies pairs of bfloat16 exactly and sums in float32).
  if constexpr (std::is_same_v<T, c10::BFloat16> && DIM > 0 && DIM % 32 == 0) {
    constexpr int L = DIM / 32;
    prefetch_block(k_cache, 0);
    for (int64_t g = 0; g < group; ++g) {
      __m512bh qv[L];
      for (int j = 0; j < L; ++j) qv[j] = (__m512bh)_mm512_loadu_si512(q_group + g * DIM + 32 * j);
      float* sg = scores.data() + g * context;
      for (int64_t blk = 0; blk < num_blocks; ++blk) {
        const T* kb = block_of(k_cache, blk);
        const int64_t rows = std::min(block_size, context - blk * block_size);
        if (g == 0) prefetch_block(k_cache, blk + 1);  // the group's other heads find it in cache
        for (int64_t r = 0; r < rows; ++r) {
          __m512 acc = _mm512_setzero_ps();
          for (int j = 0; j < L; ++j)
            acc = _mm512_dpbf16_ps(acc, qv[j], (__m512bh)_mm512_loadu_si512(kb + r * DIM + 32 * j));
          sg[blk * block_size + r] = _mm512_reduce_add_ps(acc) * scale;
        }
      }
    }
  } else
#endif
  {  // Pass 1: each K block widened once, then scored against every query head of the group.
    queries.resize(group * dim);
    for (int64_t i = 0; i < group * dim; ++i) queries[i] = static_cast<float>(q_group[i]) * scale;
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      const int64_t rows = std::min(block_size, context - blk * block_size);
      prefetch_block(k_cache, blk + 1);
      const float* k = widen(block_of(k_cache, blk), block.data(), rows * dim);
      for (int64_t g = 0; g < group; ++g) {
        const float* query = queries.data() + g * dim;
        float* sg = scores.data() + g * context + blk * block_size;
        for (int64_t r = 0; r < rows; ++r) {
          const float* kr = k + r * dim;
          float s = 0.f;
          for (int64_t d = 0; d < dim; ++d) s += query[d] * kr[d];
          sg[r] = s;
        }
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores.data() + g * context;
    const float top = *std::max_element(sg, sg + context);
    float sum = 0.f;
    for (int64_t t = 0; t < context; ++t) {
      sg[t] = std::exp(sg[t] - top);
      sum += sg[t];
    }
    const float inv = 1.f / sum;
    for (int64_t t = 0; t < context; ++t) sg[t] *= inv;
  }
  // Pass 2: each V block widened once, then summed into every query head's output.
  outs.assign(group * dim, 0.f);
  prefetch_block(v_cache, 0);
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t rows = std::min(block_size, context - blk * block_size);
    prefetch_block(v_cache, blk + 1);
    const float* v = widen(block_of(v_cache, blk), block.data(), rows * dim);
    for (int64_t g = 0; g < group; ++g) {
      const float* pg = scores.data() + g * context + blk * block_size;
      float* og = outs.data() + g * dim;
      if constexpr (DIM > 0 && DIM % 16 == 0) {
        // The head's output row in DIM / 16 vector registers while the block's rows stream past.
        constexpr int L = DIM / 16;
        f32x16 accv[L];
        for (int j = 0; j < L; ++j) std::memcpy(&accv[j], og + 16 * j, sizeof(f32x16));
        for (int64_t r = 0; r < rows; ++r) {
          const float p = pg[r];
          const float* vr = v + r * dim;
          for (int j = 0; j < L; ++j) {
            f32x16 x;
            std::memcpy(&x, vr + 16 * j, sizeof(f32x16));
            accv[j] += p * x;
          }
        }
        for (int j = 0; j < L; ++j) std::memcpy(og + 16 * j, &accv[j], sizeof(f32x16));
      } else {
        for (int64_t d = 0; d < dim; ++d) acc[d] = og[d];
        for (int64_t r = 0; r < rows; ++r) {
          const float p = pg[r];
          const float* vr = v + r * dim;
          for (int64_t d = 0; d < dim; ++d) acc[d] += p * vr[d];
        }
        for (int64_t d = 0; d < dim; ++d) og[d] = acc[d];
      }
    }
  }
  for (int64_t i = 0; i < group * dim; ++i) out_group[i] = static_cast<T>(outs[i]);
}

template <typename T, int DIM>
void decode_attention(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                      const int32_t* context_lens, T* out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t block_size, int64_t dim, int64_t max_blocks,
                      float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t block_stride = kv_heads * block_size * dim;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, block, queries, outs;  // reused by every task of the thread
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kv_head = task % kv_heads;
      const int64_t context = context_lens[b];
      T* out_group = out + (b * heads + kv_head * group) * dim;
      if (context <= 0) {  // nothing to attend to: a zero output, never a read
        std::fill(out_group, out_group + group * dim, T(0));
        continue;
      }
      attend<T, DIM>(q + (b * heads + kv_head * group) * dim, k_cache, v_cache,
                     tables + b * max_blocks, context, out_group, group, block_size, dim,
                     block_stride, kv_head * block_size * dim, scale, scores, block, queries,
                     outs);
    }
  });
}

template <typename T>
void decode_attention_any_dim(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                              const int32_t* context_lens, T* out, int64_t batch, int64_t heads,
                              int64_t kv_heads, int64_t block_size, int64_t dim, int64_t max_blocks,
                              float scale) {
  switch (dim) {  // the common head sizes get their own unrolled code
    case 64:
      return decode_attention<T, 64>(q, k_cache, v_cache, tables, context_lens, out, batch, heads,
                                     kv_heads, block_size, dim, max_blocks, scale);
    case 128:
      return decode_attention<T, 128>(q, k_cache, v_cache, tables, context_lens, out, batch, heads,
                                      kv_heads, block_size, dim, max_blocks, scale);
    default:
      return decode_attention<T, 0>(q, k_cache, v_cache, tables, context_lens, out, batch, heads,
                                    kv_heads, block_size, dim, max_blocks, scale);
  }
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3, "q must be [batch, heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "k_cache and v_cache must be [num_blocks, kv_heads, block_size, head_dim]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
              "block_tables and context_lens must be int32");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "q and the caches disagree on head_dim");
  TORCH_CHECK(q.size(2) <= kMaxHeadDim, "head_dim over ", kMaxHeadDim, " is not supported");
  const auto query = q.contiguous();
  const auto tables = block_tables.contiguous();
  const auto lens = context_lens.contiguous();
  TORCH_CHECK(tables.size(0) == query.size(0) && lens.size(0) == query.size(0),
              "one block table and one context length per query");
  auto out = at::empty_like(query);
  if (paged_decode_attention_avx512(query, k_cache, v_cache, tables, lens, out, scale)) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_decode_attention", [&] {
    decode_attention_any_dim<scalar_t>(query.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                               v_cache.data_ptr<scalar_t>(), tables.data_ptr<int32_t>(),
                               lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(), query.size(0),
                               query.size(1), k_cache.size(1), k_cache.size(2), query.size(2),
                               tables.size(1), static_cast<float>(scale));
  });
  return out;
}
