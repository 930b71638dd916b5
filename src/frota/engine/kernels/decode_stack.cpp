// A Llama decoder stack for decode steps, run layer after layer in one C++ call.
//
// A decode step does little arithmetic per kernel at small batches: in Python each layer is
// ten kernel calls wrapped in module calls, shape checks and views, and on a 2-core machine
// that overhead was 43% of a batch-1 int4 step. DecodeStack holds every layer's
// weights and KV caches once (built by frota/engine/model/decode_stack.py) and runs the same
// kernels in the same order as the Python layers do, so its output is bit for bit theirs:
//
//   h = rms_norm(x); qkv = linear(h); rope_and_cache(qkv); o = paged_decode_attention(q)
//   h = linear(o); h = add_rms_norm(h, x) (x += h); x = x + linear(silu_and_mul(linear(h)))
//
// Each projection is one of the layers' kinds, run by the op their forward runs:
// - "int4": Frota's kernel layout (qs, d, m), through quant_ops.cpp's int4_mm, which that
//   extension passes in as a function pointer (each extension keeps its compiler flags);
// - "amx": a bfloat16 weight in the AMX tiles' layout (AmxLinear), through amx_linear.cpp;
// - "packed": a weight oneDNN packed once (PackedLinear), through mkldnn::_linear_pointwise;
// - "dense": a plain weight, through at::linear.
//
// A step with rows under LoRA adapters runs here too: after each projection, the delta of
// those rows over the engine's slot pool (`AdapterSlots`, built once per pool by
// decode_stack.py) goes through lora_ops.cpp's lora_gather, the call the Python layers'
// LoRALinear makes, with the same inputs: y = linear(x); y[row] += (x[row] @ A) @ B.
#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace {

struct Projection {
  enum class Kind { kInt4, kAmx, kPacked, kDense } kind;
  at::Tensor weight, d, m;  // int4: weight is qs, with d and m; otherwise d and m are unused
  int64_t size;             // int4: the group size; amx: out_features
};

struct DecoderLayer {
  at::Tensor input_norm, post_attention_norm, k_cache, v_cache;
  Projection qkv, o, gate_up, down;
};

// (kind, weight, d, m, size), as decode_stack.py passes each projection.
using ProjectionArgs = std::tuple<std::string, at::Tensor, at::Tensor, at::Tensor, int64_t>;

Projection make_projection(const ProjectionArgs& args) {
  const auto& [kind, weight, d, m, size] = args;
  if (kind == "int4") return {Projection::Kind::kInt4, weight, d, m, size};
  if (kind == "amx") return {Projection::Kind::kAmx, weight, {}, {}, size};
  if (kind == "packed") return {Projection::Kind::kPacked, weight, {}, {}, 0};
  TORCH_CHECK(kind == "dense", "unknown projection kind ", kind);
  return {Projection::Kind::kDense, weight, {}, {}, 0};
}

// torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), as PackedLinear calls it.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, packed, c10::IValue(), c10::IValue(std::string("none")),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string())};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// One adapted projection's slots: A [slots, in, k*R], B_j [slots, R, width_j] at offsets[j]
// of the projection's output, and each slot's rank per target (lora_ops.cpp).
struct ProjectionSlots {
  at::Tensor a;
  std::vector<at::Tensor> b;
  std::vector<int64_t> offsets;
  at::Tensor ranks;
};
using ProjectionSlotsArgs = std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<int64_t>, at::Tensor>;

// An engine's adapter slot pool over the stack's layers: per layer, its [qkv, o, gate_up,
// down] projections' slots, or none for a projection the pool does not adapt. The tensors
// are the pool's own (loading an adapter writes them in place), so this is built once.
class AdapterSlots {
 public:
  explicit AdapterSlots(const std::vector<std::vector<std::optional<ProjectionSlotsArgs>>>& layers) {
    for (const auto& projections : layers) {
      TORCH_CHECK(projections.size() == 4, "4 projections' slots (or None) per layer");
      auto& slots = layers_.emplace_back();
      for (size_t j = 0; j < 4; ++j)
        if (projections[j]) {
          const auto& [a, b, offsets, ranks] = *projections[j];
          slots[j] = ProjectionSlots{a, b, offsets, ranks};
        }
    }
  }

  // y += the delta of projection `j` of `layer` for the listed rows (nothing if not adapted)
  void add(at::Tensor& y, const at::Tensor& x, size_t layer, size_t j, const at::Tensor& rows,
           const at::Tensor& slots) const {
    const auto& p = layers_[layer][j];
    if (p) lora_gather(y, x, p->a, p->b, p->offsets, p->ranks, rows, slots);
  }

  size_t num_layers() const { return layers_.size(); }

 private:
  std::vector<std::array<std::optional<ProjectionSlots>, 4>> layers_;
};

class DecodeStack {
 public:
  // per layer: [input_norm, post_attention_norm, k_cache, v_cache] and the projections
  // [qkv, o, gate_up, down].
  // int4_mm: the quant extension's capsule, or None where no projection is int4.
  DecodeStack(const py::object& int4_mm, const std::vector<std::vector<at::Tensor>>& layers,
              const std::vector<std::vector<ProjectionArgs>>& projections, at::Tensor cos, at::Tensor sin,
              int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : cos_(std::move(cos)), sin_(std::move(sin)), heads_(heads), kv_heads_(kv_heads),
        head_dim_(head_dim), eps_(eps), scale_(scale) {
    if (!int4_mm.is_none()) {
      const auto capsule = int4_mm.cast<py::capsule>();
      TORCH_CHECK(std::string(capsule.name()) == kInt4MatmulCapsule, "not the int4 matmul capsule");
      int4_mm_ = reinterpret_cast<Int4MatmulFn>(capsule.get_pointer());
    }
    TORCH_CHECK(layers.size() == projections.size(), "one projection list per layer");
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& t = layers[i];
      const auto& p = projections[i];
      TORCH_CHECK(t.size() == 4 && p.size() == 4, "layer ", i, ": 4 tensors and 4 projections");
      layers_.push_back({t[0], t[1], t[2], t[3], make_projection(p[0]), make_projection(p[1]),
                         make_projection(p[2]), make_projection(p[3])});
      for (const auto* proj : {&layers_.back().qkv, &layers_.back().o, &layers_.back().gate_up,
                               &layers_.back().down})
        TORCH_CHECK(proj->kind != Projection::Kind::kInt4 || int4_mm_ != nullptr,
                    "an int4 projection needs the int4 matmul capsule");
    }
  }

  // x: [B, hidden], the embeddings of the step's B tokens (one per decoding sequence); it is
  // used as the residual stream and overwritten. Returns the last layer's output.
  // adapters: the slot pool when rows run under adapters, with those rows (indices into x)
  // and each one's slot; None for a step of the base model alone.
  at::Tensor run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_blocks,
                 const at::Tensor& slot_offsets, const at::Tensor& block_tables, const at::Tensor& context_lens,
                 const AdapterSlots* adapters, const c10::optional<at::Tensor>& adapter_rows,
                 const c10::optional<at::Tensor>& adapter_slots) const {
    TORCH_CHECK(adapters == nullptr || (adapters->num_layers() == layers_.size() && adapter_rows && adapter_slots),
                "adapter slots need one entry per layer, and the rows and slots they serve");
    // the projection y = linear(input), plus its adapter rows' delta
    auto project = [&](const at::Tensor& input, const Projection& p, size_t layer, size_t j) {
      auto y = linear(input, p);
      if (adapters != nullptr) adapters->add(y, input, layer, j, *adapter_rows, *adapter_slots);
      return y;
    };
    const int64_t batch = x.size(0), q_width = heads_ * head_dim_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const auto& layer = layers_[i];
      auto qkv = project(rms_norm(x, layer.input_norm, eps_), layer.qkv, i, 0);
      auto k_cache = layer.k_cache, v_cache = layer.v_cache;
      rope_and_cache(qkv, positions, cos_, sin_, k_cache, v_cache, slot_blocks, slot_offsets, heads_,
                     kv_heads_);
      const auto q = qkv.narrow(1, 0, q_width).view({batch, heads_, head_dim_});
      const auto o = paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale_);
      auto h = project(o.view({batch, q_width}), layer.o, i, 1);
      const auto normed = add_rms_norm(h, x, layer.post_attention_norm, eps_);
      x = x + project(silu_and_mul(project(normed, layer.gate_up, i, 2)), layer.down, i, 3);
    }
    return x;
  }

  size_t num_layers() const { return layers_.size(); }

 private:
  at::Tensor linear(const at::Tensor& x, const Projection& p) const {
    switch (p.kind) {
      case Projection::Kind::kInt4: return int4_mm_(x, p.weight, p.d, p.m, p.size);
      case Projection::Kind::kAmx: return amx_linear(x, p.weight, p.size, c10::nullopt);
      case Projection::Kind::kPacked: return packed_linear(x, p.weight);
      case Projection::Kind::kDense: break;
    }
    return at::linear(x, p.weight);
  }

  Int4MatmulFn int4_mm_ = nullptr;
  std::vector<DecoderLayer> layers_;
  at::Tensor cos_, sin_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
};

}  // namespace

void bind_decode_stack(py::module& m) {
  py::class_<AdapterSlots>(m, "AdapterSlots")
      .def(py::init<const std::vector<std::vector<std::optional<ProjectionSlotsArgs>>>&>(),
           "per layer, the [qkv, o, gate_up, down] projections' (A, [B_j], offsets, ranks) or None")
      .def("__len__", &AdapterSlots::num_layers);
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<const py::object&, const std::vector<std::vector<at::Tensor>>&,
                    const std::vector<std::vector<ProjectionArgs>>&, at::Tensor, at::Tensor, int64_t,
                    int64_t, int64_t, double, double>())
      .def("run", &DecodeStack::run, py::call_guard<py::gil_scoped_release>(), py::arg("x"),
           py::arg("positions"), py::arg("slot_blocks"), py::arg("slot_offsets"), py::arg("block_tables"),
           py::arg("context_lens"), py::arg("adapters") = py::none(), py::arg("adapter_rows") = py::none(),
           py::arg("adapter_slots") = py::none(),
           "all layers of a decode step: embeddings in, the last layer's output out")
      .def("__len__", &DecodeStack::num_layers);
}
