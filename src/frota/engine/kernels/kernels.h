// The C++ entry points one source file calls in another: the attention extension's
// (frota_cpu_kernels: bindings.cpp binds them, decode_stack.cpp runs them), and the int4
// matmul the quant extension (quant_ops.cpp) hands to it.
#pragma once

#include <ATen/ATen.h>

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale);
// decode_attention_avx512.cpp: the same into `out` on AVX-512 builds, for head sizes 64 and 128;
// false (nothing written) where it does not apply.
bool paged_decode_attention_avx512(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& context_lens, at::Tensor& out,
                                   double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
void rope_and_cache(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_blocks,
                    const at::Tensor& slot_offsets, int64_t heads, int64_t kv_heads);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
at::Tensor argmax_rows(const at::Tensor& logits);
// amx_linear.cpp: bfloat16 linear layers on AMX tiles. amx_available(): this CPU has them, the
// OS hands them out and FROTA_AMX is not 0 (read at each call); amx_pack_weight: [N, K] -> the
// tiles' layout, once; amx_linear: x [M, K] @ W^T (+ bias) -> [M, out_features], bfloat16.
bool amx_available();
at::Tensor amx_pack_weight(const at::Tensor& weight);
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                      const c10::optional<at::Tensor>& bias);
// Whether prefill_attention runs q [T, H, D] over k [C + T, KVH, D] in this build: float32
// with AVX-512, bfloat16 with AVX-512 BF16, in the head shapes it is written for.
bool prefill_attention_takes(const at::Tensor& q, const at::Tensor& k);
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);
// prefill_attention_amx.cpp: the same for bfloat16 on AMX tiles, into `out`; false (nothing
// written) where the CPU, dtype or head shapes do not allow it.
bool prefill_attention_amx(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                           double scale);

// lora_ops.cpp: y[row] += (x[row] @ A[slot]) @ B_j[slot] for each listed decode row, in place
// (LoRA's BGMV over the slot pool: A [slots, in, k*R], B_j [slots, R, width_j] at offsets[j],
// each slot's rank per target in ranks [slots, k], 0 for a target it leaves out).
void lora_gather(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const std::vector<at::Tensor>& b,
                 const std::vector<int64_t>& offsets, const at::Tensor& ranks, const at::Tensor& rows,
                 const at::Tensor& slots);

// The quant extension's int4_mm(x, qs, d, m, group), which that module exports as a pointer
// in a capsule of this name: each extension keeps its own compiler flags.
using Int4MatmulFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, int64_t);
constexpr const char* kInt4MatmulCapsule = "frota_quant.int4_mm";
