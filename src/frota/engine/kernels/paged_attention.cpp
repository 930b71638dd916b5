// Paged decode attention for CPU: one query token per sequence, read straight out of the
// block pool through the sequence's block table. Nothing is gathered or padded: each K and V
// row is read once, in place, and every (sequence, KV head) pair is one task for
// at::parallel_for. Scores live in a per-task float buffer (two passes: scores, then a
// softmax-weighted sum of V), which for decode-sized contexts stays in L2.
//
// Shapes: q [B, H, D]; k_cache, v_cache [num_blocks, KVH, block_size, D];
// block_tables [B, max_blocks] int32 (rows padded past each sequence's last block);
// context_lens [B] int32. Grouped-query attention: H = KVH * G, query head h reads KV head h / G.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename T>
void decode_attention(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                      const int32_t* context_lens, T* out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t block_size, int64_t dim, int64_t max_blocks,
                      float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t block_stride = kv_heads * block_size * dim;
  const int64_t head_stride = block_size * dim;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, query(group * dim), acc(group * dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kv_head = task % kv_heads;
      const int64_t context = context_lens[b];
      const int32_t* table = tables + b * max_blocks;
      if (context <= 0) {  // nothing to attend to: a zero output, never a read
        std::fill(out + (b * heads + kv_head * group) * dim, out + (b * heads + (kv_head + 1) * group) * dim, T(0));
        continue;
      }
      auto row = [&](const T* cache, int64_t t) {
        return cache + table[t / block_size] * block_stride + kv_head * head_stride + (t % block_size) * dim;
      };
      for (int64_t g = 0; g < group; ++g) {
        const T* qh = q + (b * heads + kv_head * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) query[g * dim + d] = static_cast<float>(qh[d]) * scale;
      }
      scores.resize(group * context);
      for (int64_t t = 0; t < context; ++t) {
        const T* k = row(k_cache, t);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = query.data() + g * dim;
          float s = 0.f;
          for (int64_t d = 0; d < dim; ++d) s += qg[d] * static_cast<float>(k[d]);
          scores[g * context + t] = s;
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
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < context; ++t) {
        const T* v = row(v_cache, t);
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * context + t];
          float* ag = acc.data() + g * dim;
          for (int64_t d = 0; d < dim; ++d) ag[d] += p * static_cast<float>(v[d]);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* oh = out + (b * heads + kv_head * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) oh[d] = static_cast<T>(acc[g * dim + d]);
      }
    }
  });
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
  const auto query = q.contiguous();
  const auto tables = block_tables.contiguous();
  const auto lens = context_lens.contiguous();
  TORCH_CHECK(tables.size(0) == query.size(0) && lens.size(0) == query.size(0),
              "one block table and one context length per query");
  auto out = at::empty_like(query);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_decode_attention", [&] {
    decode_attention<scalar_t>(query.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                               v_cache.data_ptr<scalar_t>(), tables.data_ptr<int32_t>(),
                               lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(), query.size(0),
                               query.size(1), k_cache.size(1), k_cache.size(2), query.size(2),
                               tables.size(1), static_cast<float>(scale));
  });
  return out;
}
