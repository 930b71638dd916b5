// Causal prefill attention in bfloat16 on AMX tiles: the path prefill_attention.cpp takes
// first where the CPU and OS give the tiles (Intel Sapphire Rapids and later).
//
// The AVX-512 kernel spends its time in vdpbf16ps, one 16-key row of scores per instruction;
// a tile instruction computes 16 query rows x 16 keys x 32 dimensions at once. On the 2-core
// Xeon VM, SmolLM2's chunks of 256 / 1,024 tokens run at 231 / 417 GFLOP/s here, 110 / 134
// through the AVX-512 kernel and 170 / 344 through torch's SDPA (which uses AMX too); a
// 2,048-token prefill step's attention takes 61 ms instead of 155.
//
// A tile of work is the query rows of a few tokens of every query head of one KV head's group
// (at most 16 rows, as in the AVX-512 kernel), over every key they see, in two passes:
//
// 1. scores: S = Q K^T, 16 keys at a time (Q in D/32 A tiles, K packed per KV head into
//    B tiles of 16 keys: [16-key block][D/32][16 pairs][16 keys][2]);
// 2. softmax over each row's keys up to its own position, in float32; the probabilities are
//    rounded to bfloat16 (as SDPA's bfloat16 path and the AVX-512 kernel do);
// 3. O = P V, 32 keys at a time (P as A tiles, V packed into B tiles of 16 dimensions:
//    [32-key block][D/16][16 pairs][16 dims][2]), all blocks summed in the accumulator tiles,
//    divided by the row's sum at the end.
//
// Exact softmax over the whole row (no running max) needs the row's scores in memory: 16 rows
// of float32 per key, 128 KB for 2,048 keys, per thread.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")

#include "amx.h"
#include "simd.h"

namespace {

using frota_amx::kTileWords;
using frota_simd::exp_nonpositive;
using frota_simd::kMasked;
using frota_simd::Rows;
using frota_simd::rows_of;

constexpr int64_t kRows = 16;       // query rows per tile
constexpr int64_t kKeys = 16;       // keys per score tile
constexpr int64_t kPairKeys = 32;   // keys per P.V step (16 pairs)

// One KV head's K and V in the tiles' layouts, zeros past the last key.
struct PackedHead {
  std::vector<uint16_t> k, v;
};

// Rows 0-15 of 16 x 16 32-bit elements, transposed in place.
inline void transpose16x16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

template <int DIM>
void pack_head(Rows<const uint16_t> k, Rows<const uint16_t> v, int64_t keys, int64_t head, PackedHead& out) {
  const int64_t k_blocks = (keys + kKeys - 1) / kKeys, v_blocks = (keys + kPairKeys - 1) / kPairKeys;
  out.k.resize(k_blocks * (DIM / 32) * kTileWords);
  out.v.resize(v_blocks * (DIM / 16) * kTileWords);
  // K: a tile is 16 keys x 16 pairs of dims, transposed: one key's 32 dims are a row of 16
  // 32-bit pairs, and the tile's row p holds pair p of every key.
  for (int64_t b = 0; b < k_blocks; ++b)
    for (int64_t j = 0; j < DIM / 32; ++j) {
      __m512i r[16];
      for (int64_t key = 0; key < 16; ++key)
        r[key] = b * kKeys + key < keys ? _mm512_loadu_si512(k.row(b * kKeys + key, head) + 32 * j)
                                        : _mm512_setzero_si512();
      transpose16x16(r);
      uint16_t* tile = out.k.data() + (b * (DIM / 32) + j) * kTileWords;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(tile + 32 * p, r[p]);
    }
  // V: the tile's row p holds keys 2p and 2p + 1 of 16 dims, interleaved.
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t c = 0; c < v_blocks; ++c)
    for (int64_t p = 0; p < 16; ++p) {
      const int64_t t = c * kPairKeys + 2 * p;
      for (int64_t g = 0; g < DIM / 16; ++g) {
        const __m256i a = t < keys ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.row(t, head) + 16 * g)) : zero;
        const __m256i b = t + 1 < keys ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.row(t + 1, head) + 16 * g))
                                       : zero;
        const __m512i pair = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        _mm512_storeu_si512(out.v.data() + (c * (DIM / 16) + g) * kTileWords + 32 * p, pair);
      }
    }
}

// Per-thread buffers.
struct Scratch {
  std::vector<uint16_t> q;     // [16][DIM], the tile's query rows
  std::vector<float> scores;   // [16][width]
  std::vector<uint16_t> probs; // [16][width], bfloat16
  float sums[kRows];
  alignas(64) float o[kRows * 64];  // one half of the output dims (64) at a time
};

// S[:, block] for all 16 rows: one 16 x 16 tile, summed over D / 32 products.
template <int DIM>
void score_block(const uint16_t* k_block, float* scores, int64_t stride_bytes) {
  _tile_zero(0);
  _tile_loadd(1, k_block, 64);
  _tile_dpbf16ps(0, 2, 1);
  _tile_loadd(1, k_block + kTileWords, 64);
  _tile_dpbf16ps(0, 3, 1);
  if constexpr (DIM == 128) {
    _tile_loadd(1, k_block + 2 * kTileWords, 64);
    _tile_dpbf16ps(0, 4, 1);
    _tile_loadd(1, k_block + 3 * kTileWords, 64);
    _tile_dpbf16ps(0, 5, 1);
  }
  _tile_stored(0, scores, stride_bytes);
}

template <int DIM>
void attend_tile(Rows<const uint16_t> q, const PackedHead& packed, Rows<uint16_t> out, int64_t past, int64_t t0,
                 int64_t tokens, int64_t group, int64_t head, float scale, Scratch& s) {
  const int64_t rows = tokens * group;
  const int64_t last = past + t0 + tokens - 1;  // the last key any row sees
  const int64_t k_blocks = last / kKeys + 1, v_blocks = last / kPairKeys + 1;
  const int64_t width = v_blocks * kPairKeys;
  s.q.assign(kRows * DIM, 0);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(s.q.data() + r * DIM, q.row(t0 + r / group, head * group + r % group), DIM * sizeof(uint16_t));
  s.scores.resize(kRows * width);
  s.probs.assign(kRows * width, 0);
  // 1. Scores.
  for (int64_t j = 0; j < DIM / 32; ++j) {
    switch (j) {
      case 0: _tile_loadd(2, s.q.data(), DIM * 2); break;
      case 1: _tile_loadd(3, s.q.data() + 32, DIM * 2); break;
      case 2: _tile_loadd(4, s.q.data() + 64, DIM * 2); break;
      default: _tile_loadd(5, s.q.data() + 96, DIM * 2); break;
    }
  }
  for (int64_t b = 0; b < k_blocks; ++b)
    score_block<DIM>(packed.k.data() + b * (DIM / 32) * kTileWords, s.scores.data() + b * kKeys, width * 4);
  // 2. Softmax of each row over the keys up to its token's position.
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 scaled = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t seen = past + t0 + r / group + 1;  // keys [0, seen)
    float* row = s.scores.data() + r * width;
    __m512 top = _mm512_set1_ps(kMasked);
    for (int64_t k = 0; k < seen; k += 16) {
      const __mmask16 m = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(seen - k)));
      const __m512 x = _mm512_mask_mul_ps(_mm512_set1_ps(kMasked), m, _mm512_loadu_ps(row + k), scaled);
      _mm512_storeu_ps(row + k, x);
      top = _mm512_max_ps(top, x);
    }
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    uint16_t* p = s.probs.data() + r * width;
    for (int64_t k = 0; k < seen; k += 16) {
      const __mmask16 m = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(seen - k)));
      const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + k), max)));
      sum = _mm512_add_ps(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + k), (__m256i)_mm512_cvtneps_pbh(e));
    }
    s.sums[r] = _mm512_reduce_add_ps(sum);
  }
  // 3. O = P V, 64 output dims at a time, in tiles 0-3.
  for (int64_t half = 0; half < DIM / 64; ++half) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < v_blocks; ++c) {
      _tile_loadd(4, s.probs.data() + c * kPairKeys, width * 2);
      const uint16_t* vb = packed.v.data() + (c * (DIM / 16) + half * 4) * kTileWords;
      _tile_loadd(5, vb, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(5, vb + kTileWords, 64);
      _tile_dpbf16ps(1, 4, 5);
      _tile_loadd(5, vb + 2 * kTileWords, 64);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(5, vb + 3 * kTileWords, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, s.o, 64 * 4);
    _tile_stored(1, s.o + 16, 64 * 4);
    _tile_stored(2, s.o + 32, 64 * 4);
    _tile_stored(3, s.o + 48, 64 * 4);
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t* dst = out.row(t0 + r / group, head * group + r % group) + half * 64;
      const __m512 inv = _mm512_set1_ps(1.f / s.sums[r]);
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * j),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(s.o + r * 64 + 16 * j), inv)));
    }
  }
}

template <int DIM>
void prefill(Rows<const uint16_t> q, Rows<const uint16_t> k, Rows<const uint16_t> v, Rows<uint16_t> out,
             int64_t tokens, int64_t keys, int64_t heads, int64_t kv_heads, float scale) {
  const int64_t group = heads / kv_heads, past = keys - tokens;
  const int64_t tile_tokens = std::max<int64_t>(1, kRows / group);
  const int64_t tiles = (tokens + tile_tokens - 1) / tile_tokens;
  std::vector<PackedHead> packed(kv_heads);
  at::parallel_for(0, kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) pack_head<DIM>(k, v, keys, h, packed[h]);
  });
  // Task i: KV head i / tiles, and its tiles taken early, late, early, late... (balanced halves
  // for the static split of at::parallel_for, as in the AVX-512 kernel).
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    frota_amx::configure_full_tiles();
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / tiles, i = task % tiles;
      const int64_t tile = i % 2 == 0 ? i / 2 : tiles - 1 - i / 2;
      const int64_t t0 = tile * tile_tokens;
      attend_tile<DIM>(q, packed[head], out, past, t0, std::min(tile_tokens, tokens - t0), group, head, scale,
                       scratch);
    }
    _tile_release();
  });
}

}  // namespace

#pragma GCC pop_options

bool prefill_attention_amx(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                           double scale) {
  const int64_t dim = q.size(2), heads = q.size(1), kv_heads = k.size(1);
  if (q.scalar_type() != at::kBFloat16 || (dim != 64 && dim != 128) || heads / kv_heads > kRows || !amx_available())
    return false;
  const auto run = dim == 64 ? prefill<64> : prefill<128>;
  run(rows_of<const uint16_t>(q), rows_of<const uint16_t>(k), rows_of<const uint16_t>(v), rows_of<uint16_t>(out),
      q.size(0), k.size(0), heads, kv_heads, static_cast<float>(scale));
  return true;
}

#else  // no AMX in this compiler

bool prefill_attention_amx(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, double) {
  return false;
}

#endif
