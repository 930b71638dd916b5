// bfloat16 linear layers on AMX tiles (Intel Sapphire Rapids and later).
//
// oneDNN runs bfloat16 matmuls on AMX too, but at decode sizes its calls read the weights at
// 10-14 GB/s on a 2-core Xeon VM whose memory streams about 20: a decode step's matmuls are a
// stream of weights past a handful of token rows, and the time goes to everything around the
// tile instructions. This kernel keeps the weights in the tiles' own layout, packed once at
// load, and walks them in order:
//
//   packed [N/32][K/32][2][16][32]: for each block of 32 output features and each 32 inputs,
//   two B tiles of 16 features each, in the tiles' pair order (k-pairs x features x 2).
//
// A thread takes a share of the 32-feature blocks. For each, it runs the rows of x two 16-row
// tiles at a time against the block's two B tiles (4 accumulator tiles, 2 A, 2 B: all 8 of
// AMX's tiles), over K in steps of 32. Products are exact and summed in float32 in K order,
// then rounded once to bfloat16, so the output is oneDNN's within a rounding
// (tests/engine/test_amx_linear.py). Rows go in chunks of 256, so that a chunk of x stays in
// L2 while a thread's blocks pass it.
//
// Measured on the 2-core Xeon VM, SmolLM2's 4 projections x 30 layers, bf16, oneDNN / this, in
// ms: 1 row 13.0 / 8.5, 16 rows 13.5 / 8.8, 64 rows 18.3 / 14.3, 256 rows 37.1 / 35.2; 2,048
// rows (a long prefill chunk) 188 / 229, where oneDNN's blocking for large M is the better one,
// so AmxLinear (kernels/linear.py) hands steps of over 256 rows to oneDNN.
//
// The tile instructions are compiled for this file's functions alone (the pragma below), so
// the extension still loads on CPUs without them; amx_available() says whether to call them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace {

constexpr int64_t kBlockN = 32;          // output features per block: two B tiles
constexpr int64_t kStepK = 32;           // inputs per tile step: 16 pairs
constexpr int64_t kChunkM = 256;         // rows of x per chunk

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FROTA_AMX 1

namespace {

bool cpu_has_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 24 & 1) && (edx >> 22 & 1);  // AMX-TILE, AMX-BF16
}

// Linux hands a process the tiles' register state only when it asks (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a kernel without AMX support says no.
bool request_tile_state() {
  constexpr int kReqXcompPerm = 0x1023, kXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")

#include "amx.h"

namespace {

using frota_amx::kTileWords;
using frota_amx::TileConfig;

// Tiles: C 0 1 / 2 3 (rows of A tile 4 / 5 times B tiles 6, 7), A 4 5, B 6 7.
// `top` and `bottom`: the rows of the pass's two 16-row slices (bottom may be 0).
void configure(int top, int bottom) {
  TileConfig config;
  for (int t : {0, 1, 4}) config.rows[t] = top;
  for (int t : {2, 3, 5}) config.rows[t] = bottom;
  config.rows[6] = config.rows[7] = 16;
  for (int t = 0; t < 8; ++t) config.colsb[t] = config.rows[t] ? 64 : 0;
  frota_amx::load_config(config);
}

// The accumulator tiles of one 16-row slice (`bottom`: tiles 2 and 3, else 0 and 1), its
// `rows` rows, written to `out` as bfloat16: features [0, 32) of each row, the first `cols` of
// them, plus the bias if there is one. Both tiles of a row go out in one store of a whole line.
void store_slice(bool bottom, int rows, int cols, const float* bias, uint16_t* out, int64_t out_stride) {
  alignas(64) float left[16 * 16], right[16 * 16];
  if (bottom) {
    _tile_stored(2, left, 64);
    _tile_stored(3, right, 64);
  } else {
    _tile_stored(0, left, 64);
    _tile_stored(1, right, 64);
  }
  const __mmask32 keep = cols >= 32 ? 0xffffffffu : static_cast<__mmask32>((1ull << cols) - 1);
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep), bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep >> 16), bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {  // rounded to nearest even, as c10::BFloat16 rounds
    const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(left + r * 16), b0));
    const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(right + r * 16), b1));
    _mm512_mask_storeu_epi16(out + r * out_stride, keep, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  }
}

// out [M, N] = x [M, K] @ W^T (+ bias), W packed; this thread's feature blocks [b0, b1).
void matmul_blocks(const uint16_t* x, const uint16_t* packed, const float* bias, uint16_t* out, int64_t M,
                   int64_t K, int64_t N, int64_t b0, int64_t b1) {
  const int64_t steps = K / kStepK;
  int top = -1, bottom = -1;  // the loaded configuration
  for (int64_t m_chunk = 0; m_chunk < M; m_chunk += kChunkM) {
    const int64_t m_end = std::min(M, m_chunk + kChunkM);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const uint16_t* w = packed + blk * steps * 2 * kTileWords;
      const int64_t col = blk * kBlockN;
      for (int64_t m0 = m_chunk; m0 < m_end; m0 += 32) {
        const int rows0 = static_cast<int>(std::min<int64_t>(16, m_end - m0));
        const int rows1 = static_cast<int>(std::clamp<int64_t>(m_end - m0 - 16, 0, 16));
        if (rows0 != top || rows1 != bottom) configure(top = rows0, bottom = rows1);
        const uint16_t* a = x + m0 * K;
        _tile_zero(0);
        _tile_zero(1);
        if (rows1) {
          _tile_zero(2);
          _tile_zero(3);
        }
        for (int64_t s = 0; s < steps; ++s) {
          const uint16_t* b = w + s * 2 * kTileWords;
          _tile_loadd(6, b, 64);
          _tile_loadd(7, b + kTileWords, 64);
          _tile_loadd(4, a + s * kStepK, K * 2);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if (rows1) {
            _tile_loadd(5, a + 16 * K + s * kStepK, K * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        const int cols = static_cast<int>(std::min<int64_t>(kBlockN, N - col));
        const float* b = bias ? bias + col : nullptr;
        store_slice(false, rows0, cols, b, out + m0 * N + col, N);
        if (rows1) store_slice(true, rows1, cols, b, out + (m0 + 16) * N + col, N);
      }
    }
  }
  _tile_release();
}

}  // namespace

#pragma GCC pop_options

#endif

bool amx_available() {
#if defined(FROTA_AMX)
  static const bool available = cpu_has_amx_bf16() && request_tile_state();
  const char* wanted = std::getenv("FROTA_AMX");  // read each time: "0" switches the tiles off
  return available && !(wanted && std::strcmp(wanted, "0") == 0);
#else
  return false;
#endif
}

at::Tensor amx_pack_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "the weight must be [N, K] bfloat16");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % kStepK == 0, "AMX linear layers take K a multiple of 32, not ", K);
  const int64_t blocks = (N + kBlockN - 1) / kBlockN, steps = K / kStepK;
  const auto w = weight.contiguous();
  auto packed = at::zeros({blocks, steps, 2, 16, 32}, weight.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr());
  // Tile element (pair p, feature f, e) of step s holds W[feature][s * 32 + 2 p + e].
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk)
      for (int64_t f = 0; f < kBlockN && blk * kBlockN + f < N; ++f) {
        const uint16_t* row = src + (blk * kBlockN + f) * K;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t s = k / kStepK, pair = k % kStepK / 2;
          dst[(((blk * steps + s) * 2 + f / 16) * 16 + pair) * 32 + f % 16 * 2 + k % 2] = row[k];
        }
      }
  });
  return packed;
}

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                      const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(amx_available(), "this CPU or kernel gives no AMX tiles");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be [M, K] bfloat16");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "the weight must come from amx_pack_weight");
  const int64_t M = x.size(0), K = x.size(1), steps = packed.size(1);
  TORCH_CHECK(K == steps * kStepK, "x has ", K, " features, the weight takes ", steps * kStepK);
  TORCH_CHECK(out_features > (packed.size(0) - 1) * kBlockN && out_features <= packed.size(0) * kBlockN,
              "out_features does not match the packed weight");
  at::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out_features, "bias must have out_features elements");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  auto out = at::empty({M, out_features}, x.options());
  if (M == 0) return out;
#if defined(FROTA_AMX)
  const auto a = x.contiguous();
  const auto* xs = reinterpret_cast<const uint16_t*>(a.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* b = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, packed.size(0), 1, [&](int64_t b0, int64_t b1) {
    matmul_blocks(xs, w, b, o, M, K, out_features, b0, b1);
  });
#endif
  return out;
}
