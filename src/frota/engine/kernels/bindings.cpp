// The Python module of Frota's CPU kernels (see __init__.py).
#include <torch/extension.h>

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
void rope_and_cache(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_blocks,
                    const at::Tensor& slot_offsets, int64_t heads, int64_t kv_heads);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
at::Tensor argmax_rows(const at::Tensor& logits);

// Each kernel releases the GIL while it runs, as torch's own ops do: in `frota worker` the
// server's event loop shares the process with the engine's step thread.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("paged_decode_attention", &paged_decode_attention, release,
        "Decode attention over a paged KV pool (one query token per sequence)");
  m.def("rms_norm", &rms_norm, release, "weight * rms_norm(x)");
  m.def("add_rms_norm", &add_rms_norm, release, "residual += x in place; returns weight * rms_norm(residual)");
  m.def("rope_and_cache", &rope_and_cache, release,
        "Rotary embedding of q and k in the fused qkv, in place, and k/v written to the paged caches");
  m.def("silu_and_mul", &silu_and_mul, release, "silu(gate) * up");
  m.def("argmax_rows", &argmax_rows, release, "each row's first largest element's index (greedy sampling)");
}
