// Fused per-token layer ops for the CPU. Each replaces a chain of small PyTorch ops (5 to 16
// kernel launches, each a pass over memory and a trip through the dispatcher) with one pass;
// at decode batch sizes that dispatch overhead is most of a step's non-matmul time.
// Arithmetic is float32; each output is rounded once to the tensor's dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace {

constexpr int64_t kRowGrain = 16;  // rows per parallel task

// With x == nullptr, a plain norm of `residual` (which is then only read).
template <typename T>
void add_rms_norm_rows(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t width,
                       float eps) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* res = residual + r * width;
      float sum = 0.f;
      if (x != nullptr) {
        const T* in = x + r * width;
        for (int64_t i = 0; i < width; ++i) res[i] = static_cast<T>(static_cast<float>(res[i]) + static_cast<float>(in[i]));
      }
      for (int64_t i = 0; i < width; ++i) {
        const float hf = static_cast<float>(res[i]);
        sum += hf * hf;
      }
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(width) + eps);
      T* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) {
        const T normed = static_cast<T>(static_cast<float>(res[i]) * inv);
        o[i] = static_cast<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
      }
    }
  });
}

template <typename T>
void rope_and_cache_rows(T* qkv, const int64_t* positions, const float* cos, const float* sin,
                         T* k_cache, T* v_cache, const int64_t* slot_blocks,
                         const int64_t* slot_offsets, int64_t tokens, int64_t heads,
                         int64_t kv_heads, int64_t dim, int64_t block_size) {
  const int64_t half = dim / 2;
  const int64_t row_width = (heads + 2 * kv_heads) * dim;
  const int64_t block_stride = kv_heads * block_size * dim;
  at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T* row = qkv + t * row_width;
      const float* c = cos + positions[t] * dim;
      const float* s = sin + positions[t] * dim;
      // q heads then k heads sit next to each other in the fused projection's output.
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        T* v = row + h * dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = static_cast<float>(v[i]), x2 = static_cast<float>(v[i + half]);
          v[i] = static_cast<T>(x1 * c[i] - x2 * s[i]);
          v[i + half] = static_cast<T>(x2 * c[i + half] + x1 * s[i + half]);
        }
      }
      const int64_t base = slot_blocks[t] * block_stride + slot_offsets[t] * dim;
      const T* k = row + heads * dim;
      const T* val = k + kv_heads * dim;
      for (int64_t h = 0; h < kv_heads; ++h) {
        std::copy(k + h * dim, k + (h + 1) * dim, k_cache + base + h * block_size * dim);
        std::copy(val + h * dim, val + (h + 1) * dim, v_cache + base + h * block_size * dim);
      }
    }
  });
}

template <typename T>
void silu_and_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t width) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * width;
      const T* u = g + width;
      T* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) {
        const float gf = static_cast<float>(g[i]);
        o[i] = static_cast<T>(gf / (1.f + std::exp(-gf)) * static_cast<float>(u[i]));
      }
    }
  });
}

typedef float f32x16 __attribute__((vector_size(64)));

// The index of the first largest element of a float32 row: a vectorized max, then a scan for
// its first occurrence (a row of logits stays in L2 between the two passes).
int64_t argmax_row(const float* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  f32x16 top = {lowest, lowest, lowest, lowest, lowest, lowest, lowest, lowest,
                lowest, lowest, lowest, lowest, lowest, lowest, lowest, lowest};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x16 v;
    std::memcpy(&v, x + i, sizeof(v));
    top = v > top ? v : top;
  }
  float best = lowest;
  for (int lane = 0; lane < 16; ++lane) best = std::max(best, top[lane]);
  for (; i < n; ++i) best = std::max(best, x[i]);
  for (i = 0; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every element -inf (or NaN): the first, as torch.argmax answers for -inf
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous [tokens, width] tensor");
}

}  // namespace

// residual += x (in place), then returns weight * rms_norm(residual).
at::Tensor add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes() && weight.numel() == x.size(1), "x, residual and weight disagree");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type() && x.scalar_type() == weight.scalar_type(),
              "x, residual and weight must share a dtype");
  auto out = at::empty_like(x);
  const auto w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

// weight * rms_norm(x).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.numel() == x.size(1) && x.scalar_type() == weight.scalar_type(),
              "x and weight disagree on width or dtype");
  auto out = at::empty_like(x);
  const auto w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    add_rms_norm_rows<scalar_t>(nullptr, const_cast<scalar_t*>(x.data_ptr<scalar_t>()), w.data_ptr<scalar_t>(),
                                out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

// Rotates the q and k heads of the fused projection output in place (rotate-half RoPE), and
// writes k and v into the paged caches at each token's slot.
void rope_and_cache(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& slot_blocks, const at::Tensor& slot_offsets, int64_t heads,
                    int64_t kv_heads) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.is_contiguous() &&
              v_cache.is_contiguous(), "the caches must be contiguous [num_blocks, kv_heads, block_size, head_dim]");
  const int64_t dim = k_cache.size(3);
  TORCH_CHECK(k_cache.size(1) == kv_heads && qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "qkv's width must be (heads + 2 * kv_heads) * head_dim");
  TORCH_CHECK(qkv.scalar_type() == k_cache.scalar_type() && qkv.scalar_type() == v_cache.scalar_type(),
              "qkv and the caches must share a dtype");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == dim, "cos and sin must be contiguous float32 [positions, head_dim]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_blocks.scalar_type() == at::kLong &&
              slot_offsets.scalar_type() == at::kLong, "positions and slots must be int64");
  const int64_t tokens = qkv.size(0);
  TORCH_CHECK(positions.numel() == tokens && slot_blocks.numel() == tokens && slot_offsets.numel() == tokens,
              "one position and one slot per token");
  const auto pos = positions.contiguous(), blocks = slot_blocks.contiguous(), offsets = slot_offsets.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_and_cache", [&] {
    rope_and_cache_rows<scalar_t>(qkv.data_ptr<scalar_t>(), pos.data_ptr<int64_t>(), cos.data_ptr<float>(),
                                  sin.data_ptr<float>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                                  blocks.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(), tokens, heads,
                                  kv_heads, dim, k_cache.size(2));
  });
}

// silu(gate) * up for a [tokens, 2 * width] gate/up projection output.
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's width must be even");
  const int64_t width = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), width}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gate_up.size(0), width);
  });
  return out;
}

// The index of each row's largest element (the first one on ties), as torch.argmax(dim=-1):
// greedy decoding's token choice over a [rows, vocab] float32 logits tensor, rows in parallel.
at::Tensor argmax_rows(const at::Tensor& logits) {
  check_rows(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "logits must be float32");
  auto out = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t width = logits.size(1);
  at::parallel_for(0, logits.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = argmax_row(x + r * width, width);
  });
  return out;
}
