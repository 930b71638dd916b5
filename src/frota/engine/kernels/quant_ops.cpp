// Frota's int8 / int4 weight-only matmuls for a few activation rows (decode), and the
// dequantizations prefill uses; the Python side is frota/engine/quant/cpu_kernels.py.
//
// int8_mm(x, q, scales, group): q int8 [N, K]; scales float32 [N] (per channel, group 0)
//   or [N, K / group].
// int4_mm(x, qs, d, m, group): qs uint8 [N, K / 2] in GGUF's nibble order (in each run of
//   32 elements, byte i holds element i in its low nibble and element i + 16 in its high
//   one); d, m float16 or float32 [N, K / group]; w = q * d + m (GGUF Q4_1 exactly).
// int4_dequant(qs, d, m, group, dtype) / int8_dequant(q, scales, group, dtype): the weight
//   as dtype, for many rows (prefill).
//
// One activation row reads the weight once (bfloat16 int4 through vdpbf16ps); up to four
// rows share each dequantized weight register (tiles of 4 x 4). Each output element is a
// float32 dot product of the activation row (converted to float32) with the dequantized
// weight row, rounded once to the output dtype. Rows of the weight are split into tasks
// with at::parallel_for, over torch's threads (the extension is built with -fopenmp).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <vector>
#include <cstring>

#include "kernels.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int R = 4;  // weight rows per block: independent accumulators, one read of x per k
constexpr int PF = 2;  // prefetch the weight this many blocks ahead (one cache line per step)

// activation rows -> float32 [M, K]
std::vector<float> x_as_float(const at::Tensor& x) {
  auto xc = x.contiguous();
  const int64_t n = xc.numel();
  std::vector<float> out(n);
  if (xc.scalar_type() == at::kFloat) {
    std::memcpy(out.data(), xc.data_ptr<float>(), n * sizeof(float));
  } else if (xc.scalar_type() == at::kBFloat16) {
    const auto* p = xc.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  } else if (xc.scalar_type() == at::kHalf) {
    const auto* p = xc.data_ptr<at::Half>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  } else {
    TORCH_CHECK(false, "frota kernels: activations must be float32, bfloat16 or float16");
  }
  return out;
}

template <typename T>
void store_rows(const std::vector<float>& y, at::Tensor& out) {
  T* o = out.data_ptr<T>();
  for (size_t i = 0; i < y.size(); ++i) o[i] = static_cast<T>(y[i]);
}

at::Tensor finish(const std::vector<float>& y, int64_t M, int64_t N, const at::Tensor& x) {
  auto out = at::empty({M, N}, x.options());
  if (x.scalar_type() == at::kFloat) store_rows<float>(y, out);
  else if (x.scalar_type() == at::kBFloat16) store_rows<at::BFloat16>(y, out);
  else store_rows<at::Half>(y, out);
  return out;
}

inline float sf(at::Half h) { return static_cast<float>(h); }
inline float sf(float f) { return f; }

// n scales (float16 or float32) -> float32
inline void load_scales(const at::Half* p, int64_t n, float* out) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))));
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(p[i]);
}
inline void load_scales(const float* p, int64_t n, float* out) { std::memcpy(out, p, n * sizeof(float)); }

// The float32 dot product of a dequantized weight row with an activation row.
inline float dot(const float* w, const float* x, int64_t K) {
  float acc = 0.f;
  int64_t k = 0;
#ifdef __AVX512F__
  __m512 a = _mm512_setzero_ps(), c = a;
  for (; k + 32 <= K; k += 32) {
    a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
    c = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), c);
  }
  acc = _mm512_reduce_add_ps(_mm512_add_ps(a, c));
#endif
  for (; k < K; ++k) acc += w[k] * x[k];
  return acc;
}

#ifdef __AVX512F__
inline __m512 i8x16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Four consecutive int8 weight rows (row stride K, from q0) times one activation row xr,
// over columns [k0, k1) in steps of 16, added to acc[0..3] (one accumulator per row).
__attribute__((always_inline)) inline void dot4_int8(const int8_t* q0, const float* xr, int64_t K,
                                                     int64_t k0, int64_t k1, __m512 acc[4]) {
  for (int64_t k = k0; k < k1; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(q0 + PF * R * K + 4 * k), _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(xr + k);
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(i8x16(q0 + r * K + k), xv, acc[r]);
  }
}
#endif

// ------------------------------------------------------------------ int8
// Row n of the weight dequantized into buf[0..K) (group > 0: scales [N, K/group]).
void int8_row(const int8_t* q, const float* s, int64_t K, int64_t group, float* buf) {
  if (group == 0) {
    for (int64_t k = 0; k < K; ++k) buf[k] = static_cast<float>(q[k]);
    return;
  }
  for (int64_t g = 0; g < K / group; ++g) {
    const float sc = s[g];
    int64_t k = g * group;
#ifdef __AVX512F__
    if (group % 16 == 0) {
      const __m512 vs = _mm512_set1_ps(sc);
      for (; k < (g + 1) * group; k += 16) _mm512_storeu_ps(buf + k, _mm512_mul_ps(i8x16(q + k), vs));
      continue;
    }
#endif
    for (; k < (g + 1) * group; ++k) buf[k] = static_cast<float>(q[k]) * sc;
  }
}

#ifdef __AVX512F__
// MB activation rows x R weight rows, weights dequantized in registers: each weight
// byte is read once per MB rows of x, and R * MB accumulators keep the FMAs busy.
template <int MB>
void int8_tile(const float* x, int64_t K, const int8_t* q0, const float* s0, int64_t G, int64_t group,
               float* y, int64_t N) {
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(q0 + PF * R * K + 4 * k), _MM_HINT_T0);
    __m512 xv[MB];
    for (int m = 0; m < MB; ++m) xv[m] = _mm512_loadu_ps(x + m * K + k);
    for (int r = 0; r < R; ++r) {
      __m512 w = i8x16(q0 + r * K + k);
      if (group) w = _mm512_mul_ps(w, _mm512_set1_ps(s0[r * G + k / group]));
      for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_fmadd_ps(w, xv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m)
      y[m * N + r] = _mm512_reduce_add_ps(acc[r][m]) * (group ? 1.f : s0[r]);
}

template <int MB>
void int4_tile(const float* x, int64_t K, const uint8_t* q0, const float* ds, const float* ms, int64_t G,
               int64_t group, float* y, int64_t N) {
  const int64_t rb = K / 2;
  const __m512i low4 = _mm512_set1_epi32(15);
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(q0 + PF * R * rb + 2 * k), _MM_HINT_T0);
    __m512 xl[MB], xh[MB];
    for (int m = 0; m < MB; ++m) {
      xl[m] = _mm512_loadu_ps(x + m * K + k);
      xh[m] = _mm512_loadu_ps(x + m * K + k + 16);
    }
    const int64_t g = k / group;
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + r * rb + k / 2)));
      const __m512 d = _mm512_set1_ps(ds[r * G + g]), mm = _mm512_set1_ps(ms[r * G + g]);
      const __m512 wl = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low4)), d, mm);
      const __m512 wh = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, mm);
      for (int m = 0; m < MB; ++m) {
        acc[r][m] = _mm512_fmadd_ps(wl, xl[m], acc[r][m]);
        acc[r][m] = _mm512_fmadd_ps(wh, xh[m], acc[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) y[m * N + r] = _mm512_reduce_add_ps(acc[r][m]);
}
#endif

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, int64_t group) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.dim() == 2);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous());
  const int64_t N = q.size(0), K = q.size(1), M = x.numel() / K;
  TORCH_CHECK(x.size(-1) == K);
  TORCH_CHECK(group == 0 || K % group == 0);
  const int64_t G = group == 0 ? 1 : K / group;
  std::vector<float> xf = x_as_float(x);
  std::vector<float> y(M * N);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t blocks = (N + R - 1) / R;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(R * K);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * R, rows = std::min<int64_t>(R, N - n0);
#ifdef __AVX512F__
      if (M == 1 && rows == R && K % 16 == 0 && (group == 0 || group % 16 == 0)) {
        // one activation row: dequantize in registers, four rows' dot products at once
        const float* xr = xf.data();
        const int8_t* q0 = qp + n0 * K;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        if (group == 0) {
          dot4_int8(q0, xr, K, 0, K, a);
          for (int r = 0; r < 4; ++r) y[n0 + r] = _mm512_reduce_add_ps(a[r]) * sp[n0 + r];
        } else {
          const float* s0 = sp + n0 * G;
          for (int64_t g = 0; g < G; ++g) {
            __m512 t[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            dot4_int8(q0, xr, K, g * group, (g + 1) * group, t);
            for (int r = 0; r < 4; ++r) a[r] = _mm512_fmadd_ps(t[r], _mm512_set1_ps(s0[r * G + g]), a[r]);
          }
          for (int r = 0; r < 4; ++r) y[n0 + r] = _mm512_reduce_add_ps(a[r]);
        }
        continue;
      }
      if (rows == R && K % 16 == 0 && (group == 0 || group % 16 == 0)) {
        const int8_t* q0 = qp + n0 * K;
        const float* s0 = group == 0 ? sp + n0 : sp + n0 * G;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
          const float* xm = xf.data() + m0 * K;
          float* ym = y.data() + m0 * N + n0;
          switch (std::min<int64_t>(4, M - m0)) {
            case 1: int8_tile<1>(xm, K, q0, s0, G, group, ym, N); break;
            case 2: int8_tile<2>(xm, K, q0, s0, G, group, ym, N); break;
            case 3: int8_tile<3>(xm, K, q0, s0, G, group, ym, N); break;
            default: int8_tile<4>(xm, K, q0, s0, G, group, ym, N); break;
          }
        }
        continue;
      }
#endif
      for (int64_t r = 0; r < rows; ++r)
        int8_row(qp + (n0 + r) * K, sp + (n0 + r) * G, K, group, buf.data() + r * K);
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xf.data() + m * K;
        for (int64_t r = 0; r < rows; ++r) {
          const float* w = buf.data() + r * K;
          const float acc = dot(w, xr, K);
          y[m * N + n0 + r] = group == 0 ? acc * sp[n0 + r] : acc;
        }
      }
    }
  });
  return finish(y, M, N, x);
}

// Rows of a weight dequantized by `row(n, buf)` (float32) into `out` of its dtype.
template <typename F>
at::Tensor dequant_rows(int64_t N, int64_t K, at::ScalarType dtype, const at::TensorOptions& opts, F row) {
  auto out = at::empty({N, K}, opts.dtype(dtype));
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> buf(dtype == at::kFloat ? 0 : K);
    for (int64_t n = n0; n < n1; ++n) {
      if (dtype == at::kFloat) { row(n, out.data_ptr<float>() + n * K); continue; }
      row(n, buf.data());
      if (dtype == at::kBFloat16) {
        at::BFloat16* o = out.data_ptr<at::BFloat16>() + n * K;
        int64_t k = 0;
#if defined(__AVX512BF16__)
        for (; k + 16 <= K; k += 16)  // round to nearest even, as c10::BFloat16
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + k),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(buf.data() + k)));
#endif
        for (; k < K; ++k) o[k] = static_cast<at::BFloat16>(buf[k]);
      } else {
        at::Half* o = out.data_ptr<at::Half>() + n * K;
        for (int64_t k = 0; k < K; ++k) o[k] = static_cast<at::Half>(buf[k]);
      }
    }
  });
  return out;
}

at::Tensor int8_dequant(const at::Tensor& q, const at::Tensor& scales, int64_t group, at::ScalarType dtype) {
  const int64_t N = q.size(0), K = q.size(1);
  const int64_t G = group == 0 ? 1 : K / group;
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  return dequant_rows(N, K, dtype, q.options(), [&](int64_t n, float* o) {
    int8_row(qp + n * K, sp + n * G, K, group, o);
    if (group == 0) for (int64_t k = 0; k < K; ++k) o[k] *= sp[n];
  });
}

// ------------------------------------------------------------------ int4
// Row n dequantized into buf[0..K): runs of 32 elements in 16 bytes (low nibbles
// are elements 0..15, high nibbles 16..31), w = q * d + m per group.
template <typename S>
void int4_row(const uint8_t* qs, const S* d, const S* m, int64_t K, int64_t group, float* buf) {
  for (int64_t g = 0; g < K / group; ++g) {
    const float dg = sf(d[g]), mg = sf(m[g]);
    for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
      const uint8_t* p = qs + k / 2;
#ifdef __AVX512F__
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m512 vd = _mm512_set1_ps(dg), vm = _mm512_set1_ps(mg);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
      _mm512_storeu_ps(buf + k, _mm512_fmadd_ps(lo, vd, vm));
      _mm512_storeu_ps(buf + k + 16, _mm512_fmadd_ps(hi, vd, vm));
#else
      for (int i = 0; i < 16; ++i) {
        buf[k + i] = static_cast<float>(p[i] & 15) * dg + mg;
        buf[k + 16 + i] = static_cast<float>(p[i] >> 4) * dg + mg;
      }
#endif
    }
  }
}

void check_int4(const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m, int64_t group) {
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.dim() == 2);
  TORCH_CHECK((d.scalar_type() == at::kHalf || d.scalar_type() == at::kFloat) && m.scalar_type() == d.scalar_type());
  TORCH_CHECK(d.is_contiguous() && m.is_contiguous());
  TORCH_CHECK(group % 32 == 0 && (qs.size(1) * 2) % group == 0);
  TORCH_CHECK(d.numel() == qs.size(0) * (qs.size(1) * 2 / group) && m.numel() == d.numel());
}

template <typename S>
at::Tensor int4_mm_impl(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m,
                        int64_t group) {
  const int64_t N = qs.size(0), K = qs.size(1) * 2, M = x.numel() / K, G = K / group;
  TORCH_CHECK(x.size(-1) == K);
  std::vector<float> xf = x_as_float(x);
  std::vector<float> y(M * N);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const S* dp = d.data_ptr<S>();
  const S* mp = m.data_ptr<S>();
  // per group: sum of x over the group (the m term), for one activation row
  std::vector<float> xsum(M * G);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += xf[r * K + k];
      xsum[r * G + g] = s;
    }
  const int64_t blocks = (N + R - 1) / R;
#if defined(__AVX512BF16__)
  // bfloat16 activations, one row: the nibbles become bfloat16 (128 + q has the bits
  // 0x4300 | q) and meet x in vdpbf16ps, whose products are exact in float32; the
  // 128 * sum(x) this adds per group is taken off with the m term. x is laid out per
  // 64 elements (two runs A, B) as [A0..15 B0..15 | A16..31 B16..31], the order
  // the nibbles come out of 32 bytes in.
  const bool bf16_path = M == 1 && x.scalar_type() == at::kBFloat16 && K % 64 == 0;
  std::vector<uint16_t> xa(bf16_path ? K : 0);
  if (bf16_path) {
    const uint16_t* xb = reinterpret_cast<const uint16_t*>(x.contiguous().data_ptr<at::BFloat16>());
    for (int64_t c = 0; c < K; c += 64)
      for (int i = 0; i < 16; ++i) {
        xa[c + i] = xb[c + i];
        xa[c + 16 + i] = xb[c + 32 + i];
        xa[c + 32 + i] = xb[c + 16 + i];
        xa[c + 48 + i] = xb[c + 48 + i];
      }
  }
#endif
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(R * K);
    std::vector<float> ds(R * G), ms(R * G);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * R, rows = std::min<int64_t>(R, N - n0);
#if defined(__AVX512BF16__)
      if (bf16_path && rows == R) {
        load_scales(dp + n0 * G, R * G, ds.data());
        load_scales(mp + n0 * G, R * G, ms.data());
        const uint8_t* q0 = qp + n0 * (K / 2);
        const int64_t rb = K / 2, rpg = group / 32;
        const __m512i m4 = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
        const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        __m512 a[R];
        for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < K / 64; ++c) {
          const char* pf = reinterpret_cast<const char*>(q0 + PF * R * rb + c * 128);
          _mm_prefetch(pf, _MM_HINT_T0);
          _mm_prefetch(pf + 64, _MM_HINT_T0);
          const __m512bh xl = (__m512bh)_mm512_loadu_si512(xa.data() + c * 64);
          const __m512bh xh = (__m512bh)_mm512_loadu_si512(xa.data() + c * 64 + 32);
          const int64_t g = 2 * c / rpg;
          for (int r = 0; r < R; ++r) {
            const __m512i v = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + r * rb + c * 32)));
            const __m512i lo = _mm512_ternarylogic_epi32(v, m4, bias, 0xEA);  // (v & 15) | bias
            const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(v, 4), bias);
            __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)lo, xl);
            t = _mm512_dpbf16_ps(t, (__m512bh)hi, xh);
            const float* dg = ds.data() + r * G + g;
            const __m512 dv = rpg == 1
                ? _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(
                      _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(dg)))))
                : _mm512_set1_ps(*dg);
            a[r] = _mm512_fmadd_ps(t, dv, a[r]);
          }
        }
        const __m512 c128 = _mm512_set1_ps(128.f);
        for (int r = 0; r < R; ++r) {
          for (int64_t g = 0; g < G; g += 16) {
            const __mmask16 k = G - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (G - g)) - 1);
            const __m512 dv = _mm512_maskz_loadu_ps(k, ds.data() + r * G + g);
            const __m512 mv = _mm512_maskz_loadu_ps(k, ms.data() + r * G + g);
            const __m512 xs = _mm512_maskz_loadu_ps(k, xsum.data() + g);
            a[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(dv, c128, mv), xs, a[r]);
          }
          y[n0 + r] = _mm512_reduce_add_ps(a[r]);
        }
        continue;
      }
#endif
#ifdef __AVX512F__
      if (M == 1 && rows == R) {
        // y = sum_g d_g * (x_g . q_g) + m_g * sum(x_g): nibbles to float in registers
        load_scales(dp + n0 * G, R * G, ds.data());
        load_scales(mp + n0 * G, R * G, ms.data());
        const float* xr = xf.data();
        const uint8_t* q0 = qp + n0 * (K / 2);
        const int64_t rb = K / 2;  // bytes per row
        const __m512i low4 = _mm512_set1_epi32(15);
        __m512 a[R];
        for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
          __m512 t[R];
          for (int r = 0; r < R; ++r) t[r] = _mm512_setzero_ps();
          for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
            _mm_prefetch(reinterpret_cast<const char*>(q0 + PF * R * rb + 2 * k), _MM_HINT_T0);
            const __m512 xl = _mm512_loadu_ps(xr + k), xh = _mm512_loadu_ps(xr + k + 16);
            for (int r = 0; r < R; ++r) {
              const __m512i v = _mm512_cvtepu8_epi32(
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + r * rb + k / 2)));
              t[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low4)), xl, t[r]);
              t[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), xh, t[r]);
            }
          }
          for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(t[r], _mm512_set1_ps(ds[r * G + g]), a[r]);
        }
        for (int r = 0; r < R; ++r) {
          float acc = _mm512_reduce_add_ps(a[r]);
          for (int64_t g = 0; g < G; ++g) acc += ms[r * G + g] * xsum[g];
          y[n0 + r] = acc;
        }
        continue;
      }
      if (rows == R) {
        load_scales(dp + n0 * G, R * G, ds.data());
        load_scales(mp + n0 * G, R * G, ms.data());
        const uint8_t* q0 = qp + n0 * (K / 2);
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
          const float* xm = xf.data() + m0 * K;
          float* ym = y.data() + m0 * N + n0;
          switch (std::min<int64_t>(4, M - m0)) {
            case 1: int4_tile<1>(xm, K, q0, ds.data(), ms.data(), G, group, ym, N); break;
            case 2: int4_tile<2>(xm, K, q0, ds.data(), ms.data(), G, group, ym, N); break;
            case 3: int4_tile<3>(xm, K, q0, ds.data(), ms.data(), G, group, ym, N); break;
            default: int4_tile<4>(xm, K, q0, ds.data(), ms.data(), G, group, ym, N); break;
          }
        }
        continue;
      }
#endif
      for (int64_t r = 0; r < rows; ++r)
        int4_row(qp + (n0 + r) * (K / 2), dp + (n0 + r) * G, mp + (n0 + r) * G, K, group, buf.data() + r * K);
      for (int64_t mi = 0; mi < M; ++mi) {
        const float* xr = xf.data() + mi * K;
        for (int64_t r = 0; r < rows; ++r) {
          const float* w = buf.data() + r * K;
          const float acc = dot(w, xr, K);
          y[mi * N + n0 + r] = acc;
        }
      }
    }
  });
  return finish(y, M, N, x);
}

template <typename S>
at::Tensor int4_dequant_impl(const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m, int64_t group,
                             at::ScalarType dtype) {
  const int64_t N = qs.size(0), K = qs.size(1) * 2, G = K / group;
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const S* dp = d.data_ptr<S>();
  const S* mp = m.data_ptr<S>();
  return dequant_rows(N, K, dtype, qs.options(), [&](int64_t n, float* o) {
    int4_row(qp + n * (K / 2), dp + n * G, mp + n * G, K, group, o);
  });
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m,
                   int64_t group) {
  check_int4(qs, d, m, group);
  if (d.scalar_type() == at::kHalf) return int4_mm_impl<at::Half>(x, qs, d, m, group);
  return int4_mm_impl<float>(x, qs, d, m, group);
}

at::Tensor int4_dequant(const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m, int64_t group,
                        at::ScalarType dtype) {
  check_int4(qs, d, m, group);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
  if (d.scalar_type() == at::kHalf) return int4_dequant_impl<at::Half>(qs, d, m, group, dtype);
  return int4_dequant_impl<float>(qs, d, m, group, dtype);
}

}  // namespace

// The GIL is released while a kernel runs, as torch's own ops do: the server's event
// loop keeps running beside a decode step.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  using release = py::call_guard<py::gil_scoped_release>;
  mod.def("int8_mm", &int8_mm, release());
  mod.def("int8_dequant", &int8_dequant, release());
  mod.def("int4_mm", &int4_mm, release());
  mod.def("int4_dequant", &int4_dequant, release());
  // int4_mm for C++ callers in the attention extension (decode_stack.cpp; kernels.h).
  mod.attr("int4_mm_capsule") =
      py::capsule(reinterpret_cast<void*>(static_cast<Int4MatmulFn>(&int4_mm)), kInt4MatmulCapsule);
}
