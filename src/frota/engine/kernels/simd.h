// AVX-512 helpers the attention kernels share: 16 float32 lanes per vector, and the view
// of a token-major tensor's rows their prefill kernels read.
// Include it only where AVX-512 is on: under -mavx512f or a `#pragma GCC target` naming it
// (which, unlike the flag, defines no __AVX512F__ to test here).
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>

namespace frota_simd {

// The mask's and a running max's start: finite, as -ffast-math assumes every value is.
constexpr float kMasked = -1e30f;

// A token-major [tokens, heads, D] tensor's rows: row (t, h) starts at data + t * token + h * head.
template <typename T>
struct Rows {
  T* data;
  int64_t token, head;
  T* row(int64_t t, int64_t h) const { return data + t * token + h * head; }
};

// The rows of a [tokens, heads, D] tensor whose rows are contiguous, as T (raw bits for bfloat16).
template <typename T>
Rows<T> rows_of(const at::Tensor& t) {
  return {reinterpret_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

// exp(x) for x <= 0 on 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 Taylor
// polynomial for exp(r) (relative error under 2e-7), scaled by 2^n.
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

// 16 bfloat16 (raw bits) widened to float32: a bfloat16 is a float32's upper half.
inline __m512 widen_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The slot in which transpose_sum16 expects row `r`'s vector so that lane r of its result is
// row r's sum (its shuffles leave row r in lane 4 * (r % 4) + r / 4 otherwise).
constexpr int transpose_slot(int r) { return (r >> 2) + 4 * (r & 3); }

// Lane i of the result: the sum of the 16 lanes of v[i] (v filled through transpose_slot).
// 15 adds and 30 shuffles for 16 sums, where 16 separate horizontal sums take about 8 each.
inline __m512 transpose_sum16(const __m512* v) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: lanes 0-7 one row's 8 partial sums, 8-15 the next's
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // 128-bit quarters: one row's 4 partial sums each
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // pairs of lanes within each quarter
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace frota_simd
