// Causal prefill attention for one chunk with no prior context, bfloat16 on AVX-512 BF16.
//
// torch's SDPA on the CPU ran a 2,048-token prefill step's attention (SmolLM2: 9 query
// heads, 3 KV heads, head_dim 64, chunks of 32-512 tokens) at about 62 GFLOP/s, a third
// of the step, while the step's matmuls ran at about 850 (docs/benchmarks.md). This kernel
// is flash attention shaped for vdpbf16ps, which multiplies pairs of bfloat16 exactly and
// sums them in float32:
//
// - A tile is kTileKeys keys of one KV head against the query rows of a few tokens of every
//   query head of its group (grouped-query attention: the group shares each K and V load).
// - K is repacked once per call into pairs along head_dim ([block][D/2][kTileKeys][2]), so
//   one vdpbf16ps scores kTileKeys keys for one query row: the row's pair is broadcast.
// - Softmax is online (running max and sum per row, the output rescaled when the max grows),
//   in float32; the probabilities are rounded to bfloat16 for P.V, as SDPA's bfloat16 path
//   does. V is repacked into pairs along the keys ([block][kTileKeys/2][D][2]), so one
//   vdpbf16ps adds two keys' rows into 16 output lanes.
// - Causality: a query tile reads key blocks up to its last token, and masks inside the
//   diagonal ones. Tiles are handed to the threads in pairs of an early (cheap) and a late
//   (dear) one, so the static split of at::parallel_for stays balanced.
//
// Shapes: q [T, H, D], k and v [T, KVH, D], all contiguous; out [T, H, D]. D % 32 == 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

constexpr int64_t kTileKeys = 16;  // keys per tile: one zmm of float32 scores per query row
constexpr int64_t kMaxRows = 16;   // query rows per tile (tokens x heads of the group)
// The mask's and the running max's start: finite, as -ffast-math assumes every value is.
constexpr float kMasked = -1e30f;

// Two bfloat16 values (as raw bits) in one 32-bit lane, `lo` first.
inline uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

inline uint16_t to_bf16_bits(float f) {  // round to nearest even, as c10::BFloat16 does
  return c10::BFloat16(f).x;
}

// exp(x) for x <= 0 on 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 Taylor
// polynomial for exp(r) (relative error under 2e-7, below bfloat16's rounding), scaled by 2^n.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

struct Packed {
  std::vector<uint32_t> k;  // [blocks][D/2][kTileKeys]: K pairs along head_dim
  std::vector<uint32_t> v;  // [blocks][kTileKeys/2][D]: V pairs along the keys
};

// K and V of one KV head, repacked for the tiles; keys past `tokens` are zeros (never used:
// causality masks them).
void pack_head(const uint16_t* k, const uint16_t* v, int64_t tokens, int64_t kv_heads, int64_t dim,
               int64_t head, Packed& out) {
  const int64_t blocks = (tokens + kTileKeys - 1) / kTileKeys, half = dim / 2;
  out.k.assign(blocks * half * kTileKeys, 0);
  out.v.assign(blocks * (kTileKeys / 2) * dim, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t* kr = k + (t * kv_heads + head) * dim;
    const uint16_t* vr = v + (t * kv_heads + head) * dim;
    const int64_t blk = t / kTileKeys, key = t % kTileKeys;
    uint32_t* kb = out.k.data() + blk * half * kTileKeys;
    for (int64_t d2 = 0; d2 < half; ++d2) kb[d2 * kTileKeys + key] = pair(kr[2 * d2], kr[2 * d2 + 1]);
    uint16_t* vb = reinterpret_cast<uint16_t*>(out.v.data() + (blk * (kTileKeys / 2) + key / 2) * dim);
    for (int64_t d = 0; d < dim; ++d) vb[2 * d + (key & 1)] = vr[d];
  }
}

// One tile: query tokens [t0, t0 + tokens) of KV head `head`'s group, over every key they see.
template <int DIM>
void attend_tile(const uint16_t* q, const Packed& packed, uint16_t* out, int64_t t0, int64_t tokens,
                 int64_t heads, int64_t group, int64_t head, float scale) {
  constexpr int HALF = DIM / 2, VECS = DIM / 16;
  const int64_t rows = tokens * group;
  alignas(64) float o[kMaxRows][DIM];
  float row_max[kMaxRows], row_sum[kMaxRows];
  const uint32_t* qrow[kMaxRows];
  int64_t row_token[kMaxRows];
  for (int64_t r = 0; r < rows; ++r) {
    row_token[r] = t0 + r / group;
    qrow[r] = reinterpret_cast<const uint32_t*>(q + (row_token[r] * heads + head * group + r % group) * DIM);
    row_max[r] = kMasked;
    row_sum[r] = 0.f;
    std::memset(o[r], 0, sizeof(o[r]));
  }
  const int64_t last = t0 + tokens - 1;
  const int64_t blocks = last / kTileKeys + 1;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 masked = _mm512_set1_ps(kMasked);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    // Scores: one zmm (kTileKeys keys) per row, HALF pair steps.
    __m512 s[kMaxRows];
    for (int64_t r = 0; r < rows; ++r) s[r] = _mm512_setzero_ps();
    const uint32_t* kb = packed.k.data() + blk * HALF * kTileKeys;
    for (int d2 = 0; d2 < HALF; ++d2) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(kb + d2 * kTileKeys);
      for (int64_t r = 0; r < rows; ++r)
        s[r] = _mm512_dpbf16_ps(s[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(qrow[r][d2])), kv);
    }
    const bool diagonal = (blk + 1) * kTileKeys - 1 > t0;  // some key here is after some query
    alignas(64) uint16_t p_bits[kMaxRows][kTileKeys];
    for (int64_t r = 0; r < rows; ++r) {
      __m512 x = _mm512_mul_ps(s[r], _mm512_set1_ps(scale));
      __mmask16 seen = 0xffff;
      if (diagonal) {  // keys after the row's token are masked out
        const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(blk * kTileKeys)));
        seen = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(static_cast<int>(row_token[r])));
        x = _mm512_mask_mov_ps(masked, seen, x);
      }
      const float m_new = std::max(row_max[r], _mm512_reduce_max_ps(x));
      const __m512 e = _mm512_maskz_mov_ps(seen, exp_nonpositive(_mm512_sub_ps(x, _mm512_set1_ps(m_new))));
      const float alpha = std::exp(row_max[r] - m_new);  // 0 on the first block
      row_max[r] = m_new;
      row_sum[r] = row_sum[r] * alpha + _mm512_reduce_add_ps(e);
      if (alpha != 1.f) {
        const __m512 a = _mm512_set1_ps(alpha);
        for (int vi = 0; vi < VECS; ++vi) _mm512_store_ps(o[r] + 16 * vi, _mm512_mul_ps(_mm512_load_ps(o[r] + 16 * vi), a));
      }
      // Rounded to nearest even, as c10::BFloat16 rounds.
      _mm256_store_si256(reinterpret_cast<__m256i*>(p_bits[r]), (__m256i)_mm512_cvtneps_pbh(e));
    }
    // P.V: pairs of keys into 16 output lanes per vdpbf16ps.
    const uint32_t* vb = packed.v.data() + blk * (kTileKeys / 2) * DIM;
    for (int64_t r = 0; r < rows; ++r) {
      __m512 acc[VECS];
      for (int vi = 0; vi < VECS; ++vi) acc[vi] = _mm512_load_ps(o[r] + 16 * vi);
      for (int64_t j = 0; j < kTileKeys / 2; ++j) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair(p_bits[r][2 * j], p_bits[r][2 * j + 1])));
        for (int vi = 0; vi < VECS; ++vi)
          acc[vi] = _mm512_dpbf16_ps(acc[vi], p, (__m512bh)_mm512_loadu_si512(vb + j * DIM + 16 * vi));
      }
      for (int vi = 0; vi < VECS; ++vi) _mm512_store_ps(o[r] + 16 * vi, acc[vi]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* dst = out + (row_token[r] * heads + head * group + r % group) * DIM;
    const float inv = 1.f / row_sum[r];
    for (int d = 0; d < DIM; ++d) dst[d] = to_bf16_bits(o[r][d] * inv);
  }
}

template <int DIM>
void prefill(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, int64_t tokens,
             int64_t heads, int64_t kv_heads, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t tile_tokens = std::max<int64_t>(1, kMaxRows / group);
  const int64_t tiles = (tokens + tile_tokens - 1) / tile_tokens;
  std::vector<Packed> packed(kv_heads);
  at::parallel_for(0, kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) pack_head(k, v, tokens, kv_heads, DIM, h, packed[h]);
  });
  // Task i: KV head i / tiles, and its tiles taken early, late, early, late...
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / tiles, i = task % tiles;
      const int64_t tile = i % 2 == 0 ? i / 2 : tiles - 1 - i / 2;
      const int64_t t0 = tile * tile_tokens;
      attend_tile<DIM>(q, packed[head], out, t0, std::min(tile_tokens, tokens - t0), heads, group, head,
                       scale);
    }
  });
}

}  // namespace

bool prefill_attention_takes(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxRows &&
         (head_dim == 64 || head_dim == 128);
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes(), "q must be [T, H, D], k and v [T, KVH, D]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "prefill_attention takes bfloat16");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2), "q, k and v disagree on tokens or head_dim");
  TORCH_CHECK(prefill_attention_takes(q.size(1), k.size(1), q.size(2)), "prefill_attention takes head_dim 64 or ",
              "128 and whole groups of at most ", kMaxRows, " query heads per KV head, not ", q.size(1), " heads over ",
              k.size(1), " of head_dim ", q.size(2));
  const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  auto out = at::empty_like(qc);
  const auto* qp = reinterpret_cast<const uint16_t*>(qc.data_ptr<at::BFloat16>());
  const auto* kp = reinterpret_cast<const uint16_t*>(kc.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(vc.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float s = static_cast<float>(scale);
  if (q.size(2) == 64) {
    prefill<64>(qp, kp, vp, op, q.size(0), q.size(1), k.size(1), s);
  } else {
    prefill<128>(qp, kp, vp, op, q.size(0), q.size(1), k.size(1), s);
  }
  return out;
}

#else  // no AVX-512 BF16 in this build: callers check prefill_attention_takes() first

bool prefill_attention_takes(int64_t, int64_t, int64_t) { return false; }

at::Tensor prefill_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  TORCH_CHECK(false, "prefill_attention needs a build with AVX-512 BF16");
}

#endif
