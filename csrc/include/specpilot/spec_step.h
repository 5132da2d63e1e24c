// Launchers of the greedy DFlash step's bookkeeping kernels (csrc/cuda/spec_step.cu): the glue of
// python/specpilot/engine/fused_steps.py's spec step, in two kernels instead of ~25 small torch
// ones. Torch-free: bf16 logits travel as uint16 bit patterns, the stream as a cudaStream_t in a
// void*. Each returns a cudaError_t as int (0 = success); the bindings
// (csrc/bindings/spec_step_cuda.cpp) check shapes, dtypes and devices first.
//
// Exactness: integers only. Each row's argmax is torch.argmax's (the first index of the largest
// value, NaN counting as the largest), and the bookkeeping is engine/step_kernels.py's reference,
// step for step.
#pragma once

#include <cstdint>

namespace specpilot {
namespace spec_step {

// The control buffer (int64), in python's engine/step_kernels.CONTROL order.
enum Control { kStart = 0, kCtxStart, kCtxCount, kVerifySize, kAnchor, kReplay, kMaxLength, kStep, kControlSize };

// logits [rows, vocab] (the draft's, rows = B - 1), row stride `vocab`. block [B]: block[0] = the
// anchor, block[1 + r] = row r's argmax, or replay_drafts[step * rows + r] when control[kReplay] > 0.
int cuda_pick_drafts(const uint16_t* logits, int rows, int64_t vocab, const int64_t* control,
                     const int64_t* replay_drafts, int64_t* block, void* stream);

// logits [B, vocab] (the verify's), block [B] (what was verified). Writes posterior [B] (the row
// argmaxes), out [2 + 2B] = [matched, block, posterior, start] and the next step's control (start,
// ctx_start, ctx_count, verify size, anchor; step + 1), the accepted count from replay_accepted
// [step] when control[kReplay] > 0. counter: one zeroed uint32 the kernel leaves zeroed.
int cuda_accept_block(const uint16_t* logits, int block_size, int64_t vocab, const int64_t* block,
                      const int64_t* replay_accepted, int64_t* control, int64_t* posterior, int64_t* out,
                      unsigned* counter, void* stream);

}  // namespace spec_step
}  // namespace specpilot
