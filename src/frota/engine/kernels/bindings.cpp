// The Python module of Frota's CPU kernels (see __init__.py).
#include <torch/extension.h>

#include "kernels.h"

void bind_decode_stack(py::module& m);  // decode_stack.cpp

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
  m.def("prefill_attention", &prefill_attention, release,
        "Causal attention of one prefill chunk, whose tokens are the last of k's and v's (AVX-512 builds)");
  m.def("prefill_attention_takes", &prefill_attention_takes,
        "whether prefill_attention runs these q and k (dtype, device and head shapes) in this build");
  m.def("amx_available", &amx_available, "whether this CPU and OS give AMX tiles for amx_linear");
  m.def("amx_pack_weight", &amx_pack_weight, release, "an [N, K] bfloat16 weight in amx_linear's tile layout");
  m.def("amx_linear", &amx_linear, release, py::arg("x"), py::arg("packed"), py::arg("out_features"),
        py::arg("bias") = py::none(), "x @ W^T (+ bias) in bfloat16 on AMX tiles, W from amx_pack_weight");
  m.def("lora_gather", &lora_gather, release,
        "y[row] += (x[row] @ A[slot]) @ B_j[slot] for each listed row, in place (LoRA's BGMV)");
  bind_decode_stack(m);
}
