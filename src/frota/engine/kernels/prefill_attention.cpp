// Causal prefill attention for one chunk, in bfloat16 (AVX-512 BF16) or float32 (AVX-512F).
//
// torch's SDPA on the CPU ran a 2,048-token prefill step's attention (SmolLM2: 9 query
// heads, 3 KV heads, head_dim 64, chunks of 32-512 tokens) at about 62 GFLOP/s, a third
// of the step, while the step's matmuls ran at about 850 (docs/benchmarks.md). This kernel
// is flash attention:
//
// - A tile is kTileKeys keys of one KV head against the query rows of a few tokens of every
//   query head of its group (grouped-query attention: the group shares each K and V load).
// - K is repacked once per call so that one vector instruction scores kTileKeys keys for
//   one query row, the row's element broadcast: for bfloat16, pairs along head_dim
//   ([block][D/2][kTileKeys][2]) for vdpbf16ps, which multiplies pairs exactly and sums
//   them in float32; for float32, [block][D][kTileKeys] for FMAs.
// - Softmax is online (running max and sum per row, the output rescaled when the max grows),
//   in float32. For P.V in bfloat16 the probabilities are rounded to bfloat16, as SDPA's
//   bfloat16 path does, and V is repacked into pairs along the keys ([block][kTileKeys/2][D][2]),
//   so one vdpbf16ps adds two keys' rows into 16 output lanes; float32 reads V's rows as they are.
// - Causality: the chunk's tokens are the last of the keys (any before them are its prior
//   context: an earlier chunk or a prefix-cache hit). A query tile reads key blocks up to
//   its last token, and masks inside the diagonal ones. Tiles are handed to the threads in
//   pairs of an early (cheap) and a late (dear) one, so the static split of
//   at::parallel_for stays balanced.
//
// Shapes: q [T, H, D]; k and v [C + T, KVH, D], C the prior context; out [T, H, D]. Rows
// may be strided (slices of a fused qkv); head_dim is contiguous. D is 64 or 128.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(__AVX512F__)
#include "simd.h"

namespace {

using frota_simd::exp_nonpositive;
using frota_simd::kMasked;
using frota_simd::Rows;
using frota_simd::rows_of;

constexpr int64_t kTileKeys = 16;  // keys per tile: one zmm of float32 scores per query row
constexpr int64_t kMaxRows = 16;   // query rows per tile (tokens x heads of the group)

// What differs between the element types: how K and V are packed, how a block's scores and
// its P.V are computed, and how the output is stored. `Word` is what one broadcast lane
// holds: a pair of bfloat16 (raw bits), or one float.
struct F32 {
  using Elem = float;
  using Word = float;
  using Prob = float;
  static constexpr int64_t kDimWords(int64_t dim) { return dim; }
  static int64_t v_words(int64_t dim) { return kTileKeys * dim; }
  static void pack_key(Word* kb, const Elem* kr, int64_t key, int64_t dim) {
    for (int64_t d = 0; d < dim; ++d) kb[d * kTileKeys + key] = kr[d];
  }
  static void pack_value(Word* vb, const Elem* vr, int64_t key, int64_t dim) {
    std::memcpy(vb + key * dim, vr, dim * sizeof(float));
  }
  template <int DIM, int R>
  static void scores(const Word* const* qrow, const Word* kb, __m512* s) {
    for (int d = 0; d < DIM; ++d) {
      const __m512 kv = _mm512_loadu_ps(kb + d * kTileKeys);
      for (int r = 0; r < R; ++r) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(qrow[r][d]), kv, s[r]);
    }
  }
  static void store_probs(Prob* p, __m512 e) { _mm512_store_ps(p, e); }
  template <int DIM>
  static void accumulate(__m512* acc, const Prob* p, const Word* vb) {
    for (int64_t j = 0; j < kTileKeys; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      for (int vi = 0; vi < DIM / 16; ++vi) acc[vi] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vb + j * DIM + 16 * vi), acc[vi]);
    }
  }
  static Elem store(float x) { return x; }
};

#if defined(__AVX512BF16__)
struct Bf16 {
  using Elem = uint16_t;
  using Word = uint32_t;
  using Prob = uint16_t;
  static uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }
  static constexpr int64_t kDimWords(int64_t dim) { return dim / 2; }
  static int64_t v_words(int64_t dim) { return kTileKeys / 2 * dim; }
  static void pack_key(Word* kb, const Elem* kr, int64_t key, int64_t dim) {
    for (int64_t d2 = 0; d2 < dim / 2; ++d2) kb[d2 * kTileKeys + key] = pair(kr[2 * d2], kr[2 * d2 + 1]);
  }
  static void pack_value(Word* vb, const Elem* vr, int64_t key, int64_t dim) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(vb + key / 2 * dim);
    for (int64_t d = 0; d < dim; ++d) dst[2 * d + (key & 1)] = vr[d];
  }
  template <int DIM, int R>
  static void scores(const Word* const* qrow, const Word* kb, __m512* s) {
    for (int d2 = 0; d2 < DIM / 2; ++d2) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(kb + d2 * kTileKeys);
      for (int r = 0; r < R; ++r)
        s[r] = _mm512_dpbf16_ps(s[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(qrow[r][d2])), kv);
    }
  }
  // Rounded to nearest even, as c10::BFloat16 rounds.
  static void store_probs(Prob* p, __m512 e) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(e)); }
  template <int DIM>
  static void accumulate(__m512* acc, const Prob* p, const Word* vb) {
    const auto* pairs = reinterpret_cast<const int32_t*>(p);  // keys 2j and 2j + 1, in that order
    for (int64_t j = 0; j < kTileKeys / 2; ++j) {
      const __m512bh pj = (__m512bh)_mm512_set1_epi32(pairs[j]);
      for (int vi = 0; vi < DIM / 16; ++vi)
        acc[vi] = _mm512_dpbf16_ps(acc[vi], pj, (__m512bh)_mm512_loadu_si512(vb + j * DIM + 16 * vi));
    }
  }
  static Elem store(float x) { return c10::BFloat16(x).x; }
};
#endif

template <typename E>
struct Packed {
  std::vector<typename E::Word> k;  // [blocks][kDimWords(D)][kTileKeys]
  std::vector<typename E::Word> v;  // [blocks][v_words(D)]
};

// K and V of one KV head, repacked for the tiles; keys past `keys` are zeros (never used:
// causality masks them).
template <typename E>
void pack_head(Rows<const typename E::Elem> k, Rows<const typename E::Elem> v, int64_t keys, int64_t dim,
               int64_t head, Packed<E>& out) {
  const int64_t blocks = (keys + kTileKeys - 1) / kTileKeys;
  const int64_t k_block = E::kDimWords(dim) * kTileKeys, v_block = E::v_words(dim);
  out.k.assign(blocks * k_block, 0);
  out.v.assign(blocks * v_block, 0);
  for (int64_t t = 0; t < keys; ++t) {
    const int64_t blk = t / kTileKeys, key = t % kTileKeys;
    E::pack_key(out.k.data() + blk * k_block, k.row(t, head), key, dim);
    E::pack_value(out.v.data() + blk * v_block, v.row(t, head), key, dim);
  }
}

// One tile: the chunk's tokens [t0, t0 + tokens) of KV head `head`'s group, over every key
// they see; `past` keys come before the chunk's first token. A tile always computes
// kMaxRows rows, so that every loop over them unrolls and the scores stay in registers;
// rows past the tile's own repeat its last one and are not stored.
template <typename E, int DIM>
void attend_tile(Rows<const typename E::Elem> q, const Packed<E>& packed, Rows<typename E::Elem> out, int64_t past,
                 int64_t t0, int64_t tokens, int64_t group, int64_t head, float scale) {
  using Word = typename E::Word;
  constexpr int VECS = DIM / 16, R = kMaxRows;
  constexpr int64_t k_block = E::kDimWords(DIM) * kTileKeys;
  const int64_t v_block = E::v_words(DIM);
  const int64_t rows = tokens * group;
  alignas(64) float o[R][DIM];
  alignas(64) float row_max[R], row_sum[R], block_max[R], block_sum[R];
  alignas(64) int32_t row_pos[R];  // the row's token's position among the keys
  const Word* qrow[R];
  for (int r = 0; r < R; ++r) {
    const int64_t row = std::min<int64_t>(r, rows - 1), token = t0 + row / group;
    row_pos[r] = static_cast<int32_t>(past + token);
    qrow[r] = reinterpret_cast<const Word*>(q.row(token, head * group + row % group));
    row_max[r] = kMasked;
    row_sum[r] = 0.f;
  }
  std::memset(o, 0, sizeof(o));
  const int64_t first = past + t0, last = past + t0 + tokens - 1;
  const int64_t blocks = last / kTileKeys + 1;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 masked = _mm512_set1_ps(kMasked), scaled = _mm512_set1_ps(scale);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
    E::template scores<DIM, R>(qrow, packed.k.data() + blk * k_block, s);
    // Each row's scaled, masked scores and their max in this block.
    const bool diagonal = (blk + 1) * kTileKeys - 1 > first;  // some key here is after some query
    const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(blk * kTileKeys)));
    __mmask16 seen[R];
    for (int r = 0; r < R; ++r) {
      s[r] = _mm512_mul_ps(s[r], scaled);
      seen[r] = diagonal ? _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(row_pos[r])) : 0xffff;
      s[r] = _mm512_mask_mov_ps(masked, seen[r], s[r]);  // keys after the row's token are masked out
      block_max[r] = _mm512_reduce_max_ps(s[r]);
    }
    // The running maxima and the rescaling of what came before, for all rows at once.
    const __m512 m_old = _mm512_load_ps(row_max);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_load_ps(block_max));
    const __m512 alpha = exp_nonpositive(_mm512_sub_ps(m_old, m_new));  // ~0 on the first block (o, sum 0)
    _mm512_store_ps(row_max, m_new);
    alignas(64) float alphas[R];
    _mm512_store_ps(alphas, alpha);
    alignas(64) typename E::Prob p[R][kTileKeys];
    for (int r = 0; r < R; ++r) {
      const __m512 e = _mm512_maskz_mov_ps(seen[r], exp_nonpositive(_mm512_sub_ps(s[r], _mm512_set1_ps(row_max[r]))));
      block_sum[r] = _mm512_reduce_add_ps(e);
      E::store_probs(p[r], e);
    }
    _mm512_store_ps(row_sum, _mm512_fmadd_ps(_mm512_load_ps(row_sum), alpha, _mm512_load_ps(block_sum)));
    const Word* vb = packed.v.data() + blk * v_block;
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(alphas[r]);
      __m512 acc[VECS];
      for (int vi = 0; vi < VECS; ++vi) acc[vi] = _mm512_mul_ps(_mm512_load_ps(o[r] + 16 * vi), a);
      E::template accumulate<DIM>(acc, p[r], vb);
      for (int vi = 0; vi < VECS; ++vi) _mm512_store_ps(o[r] + 16 * vi, acc[vi]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    auto* dst = out.row(t0 + r / group, head * group + r % group);
    const float inv = 1.f / row_sum[r];
    for (int d = 0; d < DIM; ++d) dst[d] = E::store(o[r][d] * inv);
  }
}

template <typename E, int DIM>
void prefill(Rows<const typename E::Elem> q, Rows<const typename E::Elem> k, Rows<const typename E::Elem> v,
             Rows<typename E::Elem> out, int64_t tokens, int64_t keys, int64_t heads, int64_t kv_heads, float scale) {
  const int64_t group = heads / kv_heads, past = keys - tokens;
  const int64_t tile_tokens = std::max<int64_t>(1, kMaxRows / group);
  const int64_t tiles = (tokens + tile_tokens - 1) / tile_tokens;
  std::vector<Packed<E>> packed(kv_heads);
  at::parallel_for(0, kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) pack_head<E>(k, v, keys, DIM, h, packed[h]);
  });
  // Task i: KV head i / tiles, and its tiles taken early, late, early, late...
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / tiles, i = task % tiles;
      const int64_t tile = i % 2 == 0 ? i / 2 : tiles - 1 - i / 2;
      const int64_t t0 = tile * tile_tokens;
      attend_tile<E, DIM>(q, packed[head], out, past, t0, std::min(tile_tokens, tokens - t0), group, head, scale);
    }
  });
}

template <typename E>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, float scale) {
  using Elem = typename E::Elem;
  const auto prefill_dim = q.size(2) == 64 ? prefill<E, 64> : prefill<E, 128>;
  prefill_dim(rows_of<const Elem>(q), rows_of<const Elem>(k), rows_of<const Elem>(v), rows_of<Elem>(out), q.size(0),
              k.size(0), q.size(1), k.size(1), scale);
}

bool takes_dtype(at::ScalarType dtype) {
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return true;
#endif
  return dtype == at::kFloat;
}

}  // namespace

bool prefill_attention_takes(const at::Tensor& q, const at::Tensor& k) {
  if (q.dim() != 3 || k.dim() != 3 || !q.device().is_cpu() || q.scalar_type() != k.scalar_type() ||
      !takes_dtype(q.scalar_type()))
    return false;
  const int64_t heads = q.size(1), kv_heads = k.size(1), dim = q.size(2);
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxRows && (dim == 64 || dim == 128) &&
         k.size(2) == dim;
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes(), "q must be [T, H, D], k and v [C + T, KVH, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() && takes_dtype(q.scalar_type()),
              "prefill_attention takes float32, or bfloat16 in AVX-512 BF16 builds, not ", q.scalar_type());
  TORCH_CHECK(q.size(0) <= k.size(0) && q.size(2) == k.size(2),
              "q's tokens must be the last of k's and v's, in the same head_dim");
  TORCH_CHECK(prefill_attention_takes(q, k), "prefill_attention takes head_dim 64 or 128 and whole groups of at ",
              "most ", kMaxRows, " query heads per KV head, not ", q.size(1), " heads over ", k.size(1),
              " of head_dim ", q.size(2));
  // Rows may be strided; each row's head_dim must be contiguous.
  const auto rows = [](const at::Tensor& t) { return t.stride(2) == 1 ? t : t.contiguous(); };
  const auto qc = rows(q), kc = rows(k), vc = rows(v);
  auto out = at::empty(q.sizes(), q.options());
  if (q.size(0) == 0) return out;
#if defined(__AVX512BF16__)
  if (q.scalar_type() == at::kBFloat16) {
    if (prefill_attention_amx(qc, kc, vc, out, scale)) return out;
    run<Bf16>(qc, kc, vc, out, static_cast<float>(scale));
    return out;
  }
#endif
  run<F32>(qc, kc, vc, out, static_cast<float>(scale));
  return out;
}

#else  // no AVX-512 in this build: callers check prefill_attention_takes() first

bool prefill_attention_takes(const at::Tensor&, const at::Tensor&) { return false; }

at::Tensor prefill_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  TORCH_CHECK(false, "prefill_attention needs a build with AVX-512");
}

#endif
