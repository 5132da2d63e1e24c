// Argument checks shared by the CPU (split12.cpp) and CUDA (split12_cuda.cpp) bindings of the
// split12 / bf16 linear ops. Messages name the bad sizes, dtypes and devices.
#pragma once
#include <torch/extension.h>

#include "check.h"

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {

inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape,
                         const at::Device& device) {
  SP_CHECK(t.scalar_type() == dtype, "split12: ", name, " must be ", dtype, ", got ", t.scalar_type());
  SP_CHECK(t.sizes() == shape, "split12: ", name, " must have shape ", shape, ", got ", t.sizes());
  SP_CHECK(t.device() == device, "split12: ", name, " is on ", t.device(), " but x is on ", device);
  SP_CHECK(t.is_contiguous(), "split12: ", name, " must be contiguous (shape ", t.sizes(), ", strides ",
           t.strides(), ")");
}

// x [M, K] bf16, out [M, N] bf16. Returns M.
inline int64_t check_x_out(const at::Tensor& x, const at::Tensor& out, int64_t N, int64_t K) {
  SP_CHECK(x.dim() == 2, "split12: x must be 2-D [M, K], got shape ", x.sizes());
  SP_CHECK(x.size(1) == K, "split12: x has ", x.size(1), " columns but the weight has K=", K);
  const int64_t M = x.size(0);
  check_tensor(x, "x", at::kBFloat16, {M, K}, x.device());
  check_tensor(out, "out", at::kBFloat16, {M, N}, x.device());
  return M;
}

// The split12 planes against x / out; returns N.
inline int64_t check_split12_args(const at::Tensor& x, const at::Tensor& lo, const at::Tensor& codes,
                                  const at::Tensor& base, const at::Tensor& esc_rowptr,
                                  const at::Tensor& esc_col, const at::Tensor& esc_val, int64_t K,
                                  const at::Tensor& out) {
  SP_CHECK(K >= 1, "split12: K must be >= 1, got ", K);
  SP_CHECK(lo.dim() == 2, "split12: lo must be 2-D [N, kpad], got shape ", lo.sizes());
  const int64_t N = lo.size(0), kpad = round_up_kpad(K);
  const at::Device dev = x.device();
  check_tensor(lo, "lo", at::kByte, {N, kpad}, dev);
  check_tensor(codes, "codes", at::kByte, {N, kpad / 2}, dev);
  check_tensor(base, "base", at::kByte, {N}, dev);
  check_tensor(esc_rowptr, "esc_rowptr", at::kInt, {N + 1}, dev);
  SP_CHECK(esc_col.dim() == 1, "split12: esc_col must be 1-D, got shape ", esc_col.sizes());
  const int64_t E = esc_col.size(0);
  check_tensor(esc_col, "esc_col", at::kInt, {E}, dev);
  check_tensor(esc_val, "esc_val", at::kShort, {E}, dev);
  check_x_out(x, out, N, K);
  return N;
}

}  // namespace split12
}  // namespace specpilot
