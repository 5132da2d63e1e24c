// Schemas and CUDA impls of the greedy DFlash step's bookkeeping ops (kernels in
// csrc/cuda/spec_step.cu, contracts in specpilot/spec_step.h). CUDA only: a CPU build has no such
// ops and python/specpilot/engine/step_kernels.py runs its torch reference instead. Out-parameter
// style on torch's current stream, so CUDA-graph capture allocates nothing inside the op.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "check.h"
#include "specpilot/spec_step.h"

namespace specpilot {
namespace spec_step {
namespace {

void check_tensor(const char* op, const char* name, const at::Tensor& t, const at::Device& device,
                  at::ScalarType dtype, const std::vector<int64_t>& shape) {
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the logits are on ", device);
  SP_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  if (!shape.empty())
    SP_CHECK(t.sizes().vec() == shape, op, ": ", name, " must have shape ", c10::IntArrayRef(shape), ", got ",
             t.sizes());
}

void check_logits(const char* op, const at::Tensor& logits) {
  SP_CHECK(logits.is_cuda(), op, ": logits must be a CUDA tensor, got one on ", logits.device());
  SP_CHECK(logits.dim() == 2 && logits.size(0) >= 1 && logits.size(1) >= 1, op,
           ": logits must be [rows, vocab], got shape ", logits.sizes());
  check_tensor(op, "logits", logits, logits.device(), at::kBFloat16, {});
}

void check_launch(const char* op, int err) {
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
void* current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

void pick_drafts_cuda(const at::Tensor& logits, const at::Tensor& control, const at::Tensor& replay_drafts,
                      const at::Tensor& block) {
  const char* op = "spec_pick_drafts";
  check_logits(op, logits);
  const at::Device dev = logits.device();
  const int64_t rows = logits.size(0);
  check_tensor(op, "control", control, dev, at::kLong, {kControlSize});
  check_tensor(op, "replay_drafts", replay_drafts, dev, at::kLong, {});
  SP_CHECK(replay_drafts.dim() == 2 && replay_drafts.size(1) == rows, op,
           ": replay_drafts must be [steps, ", std::to_string(rows), "], got shape ", replay_drafts.sizes());
  check_tensor(op, "block", block, dev, at::kLong, {rows + 1});
  const c10::cuda::CUDAGuard guard(dev);
  check_launch(op, cuda_pick_drafts(bits(logits), (int)rows, logits.size(1), control.data_ptr<int64_t>(),
                                    replay_drafts.data_ptr<int64_t>(), block.data_ptr<int64_t>(),
                                    current_stream(logits)));
}

void accept_block_cuda(const at::Tensor& logits, const at::Tensor& block, const at::Tensor& replay_accepted,
                       const at::Tensor& control, const at::Tensor& posterior, const at::Tensor& out,
                       const at::Tensor& counter) {
  const char* op = "spec_accept_block";
  check_logits(op, logits);
  const at::Device dev = logits.device();
  const int64_t b = logits.size(0);
  check_tensor(op, "block", block, dev, at::kLong, {b});
  check_tensor(op, "replay_accepted", replay_accepted, dev, at::kLong, {});
  SP_CHECK(replay_accepted.dim() == 1, op, ": replay_accepted must be [steps], got shape ", replay_accepted.sizes());
  check_tensor(op, "control", control, dev, at::kLong, {kControlSize});
  check_tensor(op, "posterior", posterior, dev, at::kLong, {b});
  check_tensor(op, "out", out, dev, at::kLong, {2 + 2 * b});
  check_tensor(op, "counter", counter, dev, at::kInt, {1});
  const c10::cuda::CUDAGuard guard(dev);
  check_launch(op, cuda_accept_block(bits(logits), (int)b, logits.size(1), block.data_ptr<int64_t>(),
                                     replay_accepted.data_ptr<int64_t>(), control.data_ptr<int64_t>(),
                                     posterior.data_ptr<int64_t>(), out.data_ptr<int64_t>(),
                                     reinterpret_cast<unsigned*>(counter.data_ptr<int32_t>()),
                                     current_stream(logits)));
}

}  // namespace
}  // namespace spec_step
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("spec_pick_drafts(Tensor logits, Tensor control, Tensor replay_drafts, Tensor(a!) block) -> ()");
  m.def("spec_accept_block(Tensor logits, Tensor block, Tensor replay_accepted, Tensor(a!) control, "
        "Tensor(b!) posterior, Tensor(c!) out, Tensor(d!) counter) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  using namespace specpilot::spec_step;
  m.impl("spec_pick_drafts", &pick_drafts_cuda);
  m.impl("spec_accept_block", &accept_block_cuda);
}
