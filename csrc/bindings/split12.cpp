// split12 op schemas and their CPU implementations:
//   split12_pack(w [N,K] bf16) -> (lo, codes, base, esc_rowptr, esc_col, esc_val)   bit-exact
//   split12_unpack(planes..., K) -> w [N,K] bf16                                      bit-exact
//   split12_linear(x [M,K], planes..., K, out [M,N]!)  y = x @ W.T, fixed order (split12_format.h)
//   bf16_linear(x [M,K], w [N,K], out [M,N]!)          the same order on plain bf16 weights
//   split12_linear_tc / bf16_linear_tc                  CUDA-only tensor-core twins (split12_cuda.cpp)
// split12_linear and bf16_linear outputs are bit-identical for the same W, on CPU and CUDA.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "check.h"

#include <tuple>

#include "split12_checks.h"
#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {
namespace {

const uint16_t* bits16(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> pack_cpu(const at::Tensor& w) {
  SP_CHECK(w.dim() == 2, "split12_pack: w must be 2-D [N, K], got shape ", w.sizes());
  SP_CHECK(w.scalar_type() == at::kBFloat16, "split12_pack: w must be bfloat16, got ", w.scalar_type());
  SP_CHECK(w.device().is_cpu(), "split12_pack: w must be on the CPU, got ", w.device());
  SP_CHECK(w.size(1) >= 1, "split12_pack: K must be >= 1, got shape ", w.sizes());
  const at::Tensor wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), kpad = round_up_kpad(K);
  auto u8 = at::TensorOptions().dtype(at::kByte);
  at::Tensor base = at::empty({N}, u8);
  at::Tensor count = at::empty({N}, at::TensorOptions().dtype(at::kInt));
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    cpu_choose_bases(bits16(wc) + n0 * K, n1 - n0, K, base.data_ptr<uint8_t>() + n0, count.data_ptr<int32_t>() + n0);
  });
  at::Tensor rowptr = at::zeros({N + 1}, at::TensorOptions().dtype(at::kLong));
  rowptr.narrow(0, 1, N).copy_(count.to(at::kLong).cumsum(0));
  const int64_t E = rowptr[N].item<int64_t>();
  SP_CHECK(E <= INT32_MAX, "split12_pack: ", E, " escapes do not fit int32 esc_rowptr");
  rowptr = rowptr.to(at::kInt);
  at::Tensor lo = at::empty({N, kpad}, u8), codes = at::empty({N, kpad / 2}, u8);
  at::Tensor col = at::empty({E}, at::TensorOptions().dtype(at::kInt));
  at::Tensor val = at::empty({E}, at::TensorOptions().dtype(at::kShort));
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    // Row pointers are absolute, so each row range writes its own slice of the escape table.
    cpu_pack(bits16(wc) + n0 * K, n1 - n0, K, base.data_ptr<uint8_t>() + n0, rowptr.data_ptr<int32_t>() + n0,
             lo.data_ptr<uint8_t>() + n0 * kpad, codes.data_ptr<uint8_t>() + n0 * (kpad / 2),
             col.data_ptr<int32_t>(), val.data_ptr<int16_t>());
  });
  return {lo, codes, base, rowptr, col, val};
}

at::Tensor unpack_cpu(const at::Tensor& lo, const at::Tensor& codes, const at::Tensor& base,
                      const at::Tensor& esc_rowptr, const at::Tensor& esc_col, const at::Tensor& esc_val, int64_t K) {
  SP_CHECK(lo.dim() == 2, "split12_unpack: lo must be 2-D [N, kpad], got shape ", lo.sizes());
  const int64_t N = lo.size(0);
  // Reuse the linear checks with a dummy 1-row x / out on the planes' device.
  at::Tensor x = at::empty({0, K}, lo.options().dtype(at::kBFloat16));
  at::Tensor out = at::empty({0, N}, lo.options().dtype(at::kBFloat16));
  check_split12_args(x, lo, codes, base, esc_rowptr, esc_col, esc_val, K, out);
  SP_CHECK(lo.device().is_cpu(), "split12_unpack: planes must be on the CPU, got ", lo.device());
  SP_CHECK(esc_rowptr[0].item<int32_t>() == 0 && esc_rowptr[N].item<int32_t>() == esc_col.size(0),
           "split12_unpack: esc_rowptr must run from 0 to E=", esc_col.size(0), ", got ",
           esc_rowptr[0].item<int32_t>(), "..", esc_rowptr[N].item<int32_t>());
  at::Tensor w = at::empty({N, K}, lo.options().dtype(at::kBFloat16));
  cpu_unpack(lo.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(), base.data_ptr<uint8_t>(),
             esc_rowptr.data_ptr<int32_t>(), esc_col.data_ptr<int32_t>(), esc_val.data_ptr<int16_t>(), N, K,
             reinterpret_cast<uint16_t*>(w.data_ptr()));
  return w;
}

void split12_linear_cpu(const at::Tensor& x, const at::Tensor& lo, const at::Tensor& codes, const at::Tensor& base,
                        const at::Tensor& esc_rowptr, const at::Tensor& esc_col, const at::Tensor& esc_val,
                        int64_t K, at::Tensor& out) {
  const int64_t N = check_split12_args(x, lo, codes, base, esc_rowptr, esc_col, esc_val, K, out);
  const int64_t M = x.size(0);
  if (M == 0 || N == 0) return;
  uint16_t* y = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    cpu_split12_linear(bits16(x), M, lo.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(), base.data_ptr<uint8_t>(),
                       esc_rowptr.data_ptr<int32_t>(), esc_col.data_ptr<int32_t>(), esc_val.data_ptr<int16_t>(),
                       N, K, n0, n1, y);
  });
}

void bf16_linear_cpu(const at::Tensor& x, const at::Tensor& w, at::Tensor& out) {
  SP_CHECK(w.dim() == 2, "bf16_linear: w must be 2-D [N, K], got shape ", w.sizes());
  const int64_t N = w.size(0), K = w.size(1);
  check_tensor(w, "w", at::kBFloat16, {N, K}, x.device());
  const int64_t M = check_x_out(x, out, N, K);
  if (M == 0 || N == 0) return;
  uint16_t* y = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { cpu_bf16_linear(bits16(x), M, bits16(w), N, K, n0, n1, y); });
}

}  // namespace
}  // namespace split12
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("split12_pack(Tensor w) -> (Tensor lo, Tensor codes, Tensor base, Tensor esc_rowptr, Tensor esc_col, "
        "Tensor esc_val)");
  m.def("split12_unpack(Tensor lo, Tensor codes, Tensor base, Tensor esc_rowptr, Tensor esc_col, Tensor esc_val, "
        "int K) -> Tensor");
  m.def("split12_linear(Tensor x, Tensor lo, Tensor codes, Tensor base, Tensor esc_rowptr, Tensor esc_col, "
        "Tensor esc_val, int K, Tensor(a!) out) -> ()");
  m.def("bf16_linear(Tensor x, Tensor w, Tensor(a!) out) -> ()");
  // Tensor-core variants (CUDA only): split12 == bf16 bit for bit, M-invariant, mma.sync order.
  m.def("split12_linear_tc(Tensor x, Tensor lo, Tensor codes, Tensor base, Tensor esc_rowptr, Tensor esc_col, "
        "Tensor esc_val, int K, Tensor(a!) out) -> ()");
  m.def("bf16_linear_tc(Tensor x, Tensor w, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CPU, m) {
  m.impl("split12_pack", &specpilot::split12::pack_cpu);
  m.impl("split12_unpack", &specpilot::split12::unpack_cpu);
  m.impl("split12_linear", &specpilot::split12::split12_linear_cpu);
  m.impl("bf16_linear", &specpilot::split12::bf16_linear_cpu);
}
