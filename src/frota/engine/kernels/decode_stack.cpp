// A Llama decoder stack for decode steps, run layer after layer in one C++ call.
//
// A decode step at batch 1 to 8 does little arithmetic per kernel: in Python each layer is
// ten kernel calls wrapped in module calls, shape checks and views, and on a 2-core machine
// that overhead was a quarter of a batch-1 int4 step. DecodeStack holds every layer's
// weights and KV caches once (built by frota/engine/model/decode_stack.py) and runs the same
// kernels in the same order as the Python layers do, so its output is bit for bit theirs:
//
//   h = rms_norm(x); qkv = int4_mm(h); rope_and_cache(qkv); o = paged_decode_attention(q)
//   h = int4_mm(o); h = add_rms_norm(h, x) (x += h); x = x + int4_mm(silu_and_mul(int4_mm(h)))
//
// It takes int4 projections in Frota's kernel layout only (quant_ops.cpp's int4_mm, passed
// in as a function pointer from that extension: each keeps its own compiler flags).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "kernels.h"

namespace {

struct Int4Projection {
  at::Tensor qs, d, m;
  int64_t group;
};

struct DecoderLayer {
  at::Tensor input_norm, post_attention_norm, k_cache, v_cache;
  Int4Projection qkv, o, gate_up, down;
};

class DecodeStack {
 public:
  // layers: per layer [input_norm, post_attention_norm, k_cache, v_cache, then qs, d, m of
  // qkv, o, gate_up and down]; groups: per layer the four projections' group sizes.
  DecodeStack(const py::capsule& int4_mm, const std::vector<std::vector<at::Tensor>>& layers,
              const std::vector<std::vector<int64_t>>& groups, at::Tensor cos, at::Tensor sin,
              int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : int4_mm_(reinterpret_cast<Int4MatmulFn>(int4_mm.get_pointer())), cos_(std::move(cos)),
        sin_(std::move(sin)), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps),
        scale_(scale) {
    TORCH_CHECK(std::string(int4_mm.name()) == kInt4MatmulCapsule, "not the int4 matmul capsule");
    TORCH_CHECK(layers.size() == groups.size(), "one group-size list per layer");
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& t = layers[i];
      const auto& g = groups[i];
      TORCH_CHECK(t.size() == 16 && g.size() == 4, "layer ", i, ": 16 tensors and 4 group sizes");
      layers_.push_back({t[0], t[1], t[2], t[3], {t[4], t[5], t[6], g[0]}, {t[7], t[8], t[9], g[1]},
                         {t[10], t[11], t[12], g[2]}, {t[13], t[14], t[15], g[3]}});
    }
  }

  // x: [B, hidden], the embeddings of the step's B tokens (one per decoding sequence); it is
  // used as the residual stream and overwritten. Returns the last layer's output.
  at::Tensor run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_blocks,
                 const at::Tensor& slot_offsets, const at::Tensor& block_tables,
                 const at::Tensor& context_lens) const {
    const int64_t batch = x.size(0), q_width = heads_ * head_dim_;
    for (const auto& layer : layers_) {
      auto qkv = mm(rms_norm(x, layer.input_norm, eps_), layer.qkv);
      auto k_cache = layer.k_cache, v_cache = layer.v_cache;
      rope_and_cache(qkv, positions, cos_, sin_, k_cache, v_cache, slot_blocks, slot_offsets, heads_,
                     kv_heads_);
      const auto q = qkv.narrow(1, 0, q_width).view({batch, heads_, head_dim_});
      const auto o = paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale_);
      auto h = mm(o.view({batch, q_width}), layer.o);
      const auto normed = add_rms_norm(h, x, layer.post_attention_norm, eps_);
      x = x + mm(silu_and_mul(mm(normed, layer.gate_up)), layer.down);
    }
    return x;
  }

  size_t num_layers() const { return layers_.size(); }

 private:
  at::Tensor mm(const at::Tensor& x, const Int4Projection& w) const {
    return int4_mm_(x, w.qs, w.d, w.m, w.group);
  }

  Int4MatmulFn int4_mm_;
  std::vector<DecoderLayer> layers_;
  at::Tensor cos_, sin_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
};

}  // namespace

void bind_decode_stack(py::module& m) {
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<const py::capsule&, const std::vector<std::vector<at::Tensor>>&,
                    const std::vector<std::vector<int64_t>>&, at::Tensor, at::Tensor, int64_t, int64_t,
                    int64_t, double, double>())
      .def("run", &DecodeStack::run, py::call_guard<py::gil_scoped_release>(),
           "all layers of a decode step: embeddings in, the last layer's output out")
      .def("__len__", &DecodeStack::num_layers);
}
