// Schemas and CUDA impls of the fused elementwise ops around the decoder's GEMMs: add_rms_norm (and
// zero_centred_add_rms_norm, the hybrid targets' norm),
// qk_norm_rope_cache, silu_mul (kernels in csrc/cuda/{fused_norm,rope_cache,silu_mul}.cu). CUDA only:
// a CPU build does not have these ops and python/specpilot/models/fused_ops.py runs the eager
// reference instead. Out-parameter style on torch's current stream, so CUDA-graph capture
// allocates nothing inside the op.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "attention_pdl.h"
#include "check.h"

#include <vector>

#include "specpilot/fused_ops.h"

namespace specpilot {
namespace fused {
namespace {

void check_bf16(const char* op, const char* name, const at::Tensor& t, const at::Device& device) {
  SP_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got one on ", t.device());
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the other inputs are on ", device);
  SP_CHECK(t.scalar_type() == at::kBFloat16, op, ": ", name, " must be bfloat16, got ", t.scalar_type());
}

void check_contiguous(const char* op, const char* name, const at::Tensor& t) {
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (shape ", t.sizes(), ", strides ", t.strides(),
           ")");
}

// The wanted shape is owned (a vector), never an ArrayRef into a braced temporary: a failing check
// formats it into the error message.
void check_shape(const char* op, const char* name, const at::Tensor& t, const std::vector<int64_t>& shape) {
  SP_CHECK(t.sizes().vec() == shape, op, ": ", name, " must have shape ", c10::IntArrayRef(shape), ", got ",
           t.sizes());
}

void check_aligned(const char* op, const char* name, const at::Tensor& t, int bytes) {
  SP_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0, op, ": ", name, " must start ", bytes,
           "-byte aligned, got ", t.data_ptr(), " (a view with an odd storage offset? pass .contiguous())");
}

void check_launch(const char* op, int err) {
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* mutable_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }
void* current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

// ---- add_rms_norm, zero_centred_add_rms_norm -------------------------------------------------
using NormLauncher = int (*)(const uint16_t*, const uint16_t*, const uint16_t*, int64_t, int, float, uint16_t*,
                             uint16_t*, void*);

void checked_add_rms_norm(const char* op, NormLauncher launch, const at::Tensor& x,
                          const std::optional<at::Tensor>& delta, const at::Tensor& weight, double eps,
                          const std::optional<at::Tensor>& sum, const at::Tensor& normed) {
  const at::Device dev = x.device();
  SP_CHECK(x.dim() >= 1, op, ": x must have a hidden dimension, got shape ", x.sizes());
  const int64_t hidden = x.size(-1);
  SP_CHECK(hidden % 8 == 0 && hidden <= kMaxHidden, op, ": the hidden size must be a multiple of 8 and <= ",
           kMaxHidden, ", got ", hidden);
  const std::vector<std::pair<const char*, const at::Tensor*>> rows = {
      {"x", &x}, {"normed", &normed}, {"delta", delta ? &*delta : nullptr}, {"sum", sum ? &*sum : nullptr}};
  for (const auto& [name, t] : rows) {
    if (t == nullptr) continue;
    check_bf16(op, name, *t, dev);
    check_shape(op, name, *t, x.sizes().vec());
    check_contiguous(op, name, *t);
    check_aligned(op, name, *t, 16);
  }
  SP_CHECK(delta || !sum, op, ": sum is written only with a delta (without one the sum is x itself)");
  check_bf16(op, "weight", weight, dev);
  check_shape(op, "weight", weight, {hidden});
  check_contiguous(op, "weight", weight);
  check_aligned(op, "weight", weight, 16);
  const int64_t n_rows = x.numel() / hidden;
  if (n_rows == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  check_launch(op, launch(bits(x), delta ? bits(*delta) : nullptr, bits(weight), n_rows, (int)hidden, (float)eps,
                          sum ? mutable_bits(*sum) : nullptr, mutable_bits(normed), current_stream(x)));
}

void add_rms_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& delta, const at::Tensor& weight,
                       double eps, const std::optional<at::Tensor>& sum, const at::Tensor& normed) {
  checked_add_rms_norm("add_rms_norm", cuda_add_rms_norm, x, delta, weight, eps, sum, normed);
}

void zero_centred_add_rms_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& delta,
                                    const at::Tensor& weight, double eps, const std::optional<at::Tensor>& sum,
                                    const at::Tensor& normed) {
  checked_add_rms_norm("zero_centred_add_rms_norm", cuda_zero_centred_add_rms_norm, x, delta, weight, eps, sum,
                       normed);
}

// ---- qk_norm_rope_cache ----------------------------------------------------------------------
// [B, T, H, D] rows with contiguous heads (stride D) and elements; any batch / token stride.
HeadRows head_rows(const char* op, const char* name, const at::Tensor& t, const at::Device& dev, int64_t B,
                   int64_t T, int64_t D) {
  check_bf16(op, name, t, dev);
  SP_CHECK(t.dim() == 4 && t.size(0) == B && t.size(1) == T && t.size(3) == D, op, ": ", name,
           " must be [B=", B, ", T=", T, ", heads, D=", D, "], got shape ", t.sizes());
  const int64_t vec = D / 64;  // elements per lane access (rope_cache.cu)
  SP_CHECK(t.stride(3) == 1 && (t.stride(2) == D || t.size(2) == 1), op, ": ", name,
           " must have contiguous heads and elements (strides [*, *, ", D, ", 1]), got strides ", t.strides());
  SP_CHECK(t.stride(0) % vec == 0 && t.stride(1) % vec == 0, op, ": ", name, " batch / token strides ",
           t.strides(), " must be multiples of ", vec);
  check_aligned(op, name, t, (int)(2 * vec));
  return HeadRows{bits(t), t.stride(0), t.stride(1), (int)t.size(2)};
}

void qk_norm_rope_cache_cuda(const std::optional<at::Tensor>& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& q_weight, const std::optional<at::Tensor>& k_weight,
                             const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions, double eps,
                             const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const std::optional<at::Tensor>& q_out) {
  const char* op = "qk_norm_rope_cache";
  const at::Device dev = k.device();
  SP_CHECK(k.dim() == 4, op, ": k must be [B, T, Hkv, D], got shape ", k.sizes());
  const int64_t B = k.size(0), T = k.size(1), Hkv = k.size(2), D = k.size(3);
  SP_CHECK(D == 64 || D == 128 || D == 256, op, ": head_dim must be 64, 128 or 256, got ", D);
  SP_CHECK(B <= INT32_MAX && T <= INT32_MAX, op, ": B=", B, " and T=", T, " must fit int32");
  const HeadRows k_rows = head_rows(op, "k", k, dev, B, T, D);
  const HeadRows v_rows = head_rows(op, "v", v, dev, B, T, D);
  SP_CHECK(v.size(2) == Hkv, op, ": v has ", v.size(2), " heads but k has ", Hkv);
  HeadRows q_rows{nullptr, 0, 0, 0};
  SP_CHECK(q.has_value() == q_out.has_value(), op, ": q and q_out come together (q ",
           q ? "given" : "absent", ", q_out ", q_out ? "given" : "absent", ")");
  SP_CHECK(q || !q_weight, op, ": q_weight given without q");
  if (q) {
    q_rows = head_rows(op, "q", *q, dev, B, T, D);
    check_bf16(op, "q_out", *q_out, dev);
    check_shape(op, "q_out", *q_out, {B, q->size(2), T, D});
    check_contiguous(op, "q_out", *q_out);
    check_aligned(op, "q_out", *q_out, (int)(D / 32));
  }
  for (const auto& [name, w] : {std::make_pair("q_weight", &q_weight), std::make_pair("k_weight", &k_weight)}) {
    if (!w->has_value()) continue;
    check_bf16(op, name, **w, dev);
    check_shape(op, name, **w, {D});
    check_contiguous(op, name, **w);
    check_aligned(op, name, **w, (int)(D / 32));
  }
  for (const auto& [name, t] : {std::make_pair("cos", &cos), std::make_pair("sin", &sin)}) {
    check_bf16(op, name, *t, dev);
    check_shape(op, name, *t, {T, D});
    check_contiguous(op, name, *t);
    check_aligned(op, name, *t, (int)(D / 32));
  }
  SP_CHECK(positions.is_cuda() && positions.device() == dev, op, ": positions must be on ", dev, ", got ",
           positions.device());
  SP_CHECK(positions.scalar_type() == at::kLong, op, ": positions must be int64, got ", positions.scalar_type());
  check_shape(op, "positions", positions, {T});
  check_contiguous(op, "positions", positions);
  SP_CHECK(k_cache.dim() == 4, op, ": k_cache must be [B, Hkv, slots, D], got shape ", k_cache.sizes());
  const int64_t slots = k_cache.size(2);
  for (const auto& [name, t] : {std::make_pair("k_cache", &k_cache), std::make_pair("v_cache", &v_cache)}) {
    check_bf16(op, name, *t, dev);
    check_shape(op, name, *t, {B, Hkv, slots, D});
    check_contiguous(op, name, *t);
    check_aligned(op, name, *t, (int)(D / 32));
  }
  if (B == 0 || T == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  check_launch(op, cuda_qk_norm_rope_cache(q_rows, k_rows, v_rows, q_weight ? bits(*q_weight) : nullptr,
                                           k_weight ? bits(*k_weight) : nullptr, bits(cos), bits(sin),
                                           positions.data_ptr<int64_t>(), (int)B, (int)T, (int)D, (float)eps,
                                           q_out ? mutable_bits(*q_out) : nullptr, mutable_bits(k_cache),
                                           mutable_bits(v_cache), slots, attention_path_pdl().load(),
                                           current_stream(k)));
}

// ---- silu_mul --------------------------------------------------------------------------------
void silu_mul_cuda(const at::Tensor& gate_up, const at::Tensor& out) {
  const char* op = "silu_mul";
  const at::Device dev = gate_up.device();
  check_bf16(op, "gate_up", gate_up, dev);
  check_contiguous(op, "gate_up", gate_up);
  SP_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, op,
           ": gate_up must end in an even dimension [..., 2I] = [gate | up], got shape ", gate_up.sizes());
  const int64_t inter = gate_up.size(-1) / 2;
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = inter;
  check_bf16(op, "out", out, dev);
  check_shape(op, "out", out, shape);
  check_contiguous(op, "out", out);
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  check_launch(op, cuda_silu_mul(bits(gate_up), out.numel() / inter, inter, mutable_bits(out), current_stream(out)));
}

}  // namespace
}  // namespace fused
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("add_rms_norm(Tensor x, Tensor? delta, Tensor weight, float eps, Tensor(a!)? sum, Tensor(b!) normed) -> ()");
  m.def("qk_norm_rope_cache(Tensor? q, Tensor k, Tensor v, Tensor? q_weight, Tensor? k_weight, Tensor cos, "
        "Tensor sin, Tensor positions, float eps, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!)? q_out) -> ()");
  m.def("silu_mul(Tensor gate_up, Tensor(a!) out) -> ()");
  m.def("zero_centred_add_rms_norm(Tensor x, Tensor? delta, Tensor weight, float eps, Tensor(a!)? sum, "
        "Tensor(b!) normed) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  using namespace specpilot::fused;
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("qk_norm_rope_cache", &qk_norm_rope_cache_cuda);
  m.impl("silu_mul", &silu_mul_cuda);
  m.impl("zero_centred_add_rms_norm", &zero_centred_add_rms_norm_cuda);
}
