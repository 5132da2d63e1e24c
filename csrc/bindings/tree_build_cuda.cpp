// Schema and CUDA impl of the draft-tree build op (kernel: csrc/cuda/tree_build.cu, contract:
// specpilot/tree_build.h). CUDA only: elsewhere python/specpilot/engine/tree/layout.py runs grow_tree
// and pack_tensors. Out-parameter style on torch's current stream (nothing allocated inside the op).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>

#include "check.h"
#include "specpilot/tree_build.h"

namespace specpilot {
namespace tree_build {
namespace {

void check_on(const char* op, const char* name, const at::Tensor& t, const at::Device& dev, at::ScalarType dtype) {
  SP_CHECK(t.device() == dev, op, ": ", name, " is on ", t.device(), " but logp is on ", dev);
  SP_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void grow_tree_cuda(const at::Tensor& logp, const at::Tensor& ids, const at::Tensor& drafted,
                    const at::Tensor& anchor, const at::Tensor& start, int64_t budget, int64_t nodes,
                    const at::Tensor& out) {
  const char* op = "grow_tree";
  SP_CHECK(logp.is_cuda(), op, ": logp must be a CUDA tensor, got one on ", logp.device());
  const at::Device dev = logp.device();
  check_on(op, "logp", logp, dev, at::kFloat);
  check_on(op, "ids", ids, dev, at::kLong);
  SP_CHECK(logp.dim() == 2 && ids.sizes() == logp.sizes(), op, ": logp and ids must both be [rows, ranks], got ",
           logp.sizes(), " and ", ids.sizes());
  const int64_t rows = logp.size(0), ranks = logp.size(1);
  SP_CHECK(budget >= 2 && budget <= kMaxBudget, op, ": budget must be in [2, ", kMaxBudget, "], got ", budget);
  SP_CHECK(rows >= 1 && rows <= kMaxRows, op, ": rows (drafted depths) must be in [1, ", kMaxRows, "], got ", rows);
  SP_CHECK(ranks >= 1 && ranks <= budget - 1, op, ": ranks must be in [1, budget - 1], got ", ranks);
  SP_CHECK(nodes >= 2 && nodes <= budget, op, ": nodes must be in [2, budget], got ", nodes);
  const auto check_scalar = [&](const char* name, const at::Tensor& t) {
    check_on(op, name, t, dev, at::kLong);
    SP_CHECK(t.numel() == 1, op, ": ", name, " must hold one element, got shape ", t.sizes());
  };
  check_scalar("drafted", drafted);
  check_scalar("anchor", anchor);
  check_scalar("start", start);
  check_on(op, "out", out, dev, at::kLong);
  const int64_t size = 4 * nodes + nodes * nodes + nodes + nodes * (rows + 1);
  SP_CHECK(out.dim() == 1 && out.size(0) == size, op, ": out must be [", size, "], got shape ", out.sizes());
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_grow_tree(logp.data_ptr<float>(), ids.data_ptr<int64_t>(), (int)rows, (int)ranks,
                                 drafted.data_ptr<int64_t>(), anchor.data_ptr<int64_t>(), start.data_ptr<int64_t>(),
                                 (int)(budget - 1), (int)nodes, out.data_ptr<int64_t>(),
                                 c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace
}  // namespace tree_build
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("grow_tree(Tensor logp, Tensor ids, Tensor drafted, Tensor anchor, Tensor start, int budget, int nodes, "
        "Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) { m.impl("grow_tree", &specpilot::tree_build::grow_tree_cuda); }
