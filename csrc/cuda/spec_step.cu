// The greedy DFlash step's bookkeeping (declarations and contracts: specpilot/spec_step.h).
// pick_drafts: one CTA per draft row takes its argmax and writes the verify block. accept_block:
// one CTA per verify row takes its argmax; the last CTA to finish (a counter it resets) counts the
// accepted drafts and writes the packed output and the next step's control, in one thread: a
// handful of integers, so a thread is enough and the order is the reference's.
#include <cuda_runtime.h>

#include <cmath>

#include "fused_bf16.cuh"
#include "specpilot/spec_step.h"

namespace specpilot {
namespace spec_step {
namespace {

using fused::bf16_to_f32;
using fused::vec_get;

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;

struct Best {
  float value;
  int64_t index;
};

// torch.argmax's order: NaN above everything, then larger values, then the smaller index.
__device__ __forceinline__ bool better(Best a, Best b) {
  const bool an = isnan(a.value), bn = isnan(b.value);
  if (an != bn) return an;
  if (!an && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

__device__ __forceinline__ Best shuffle(Best b, int offset) {
  return {__shfl_down_sync(0xffffffffu, b.value, offset), __shfl_down_sync(0xffffffffu, b.index, offset)};
}

// The argmax of one row of bf16 logits, in thread 0 (every thread takes part). The logits were just
// written (L2): each thread keeps kUnroll 16-byte loads in flight, so a row costs a few round trips.
// `better` breaks ties by index, so the order of the visits does not matter.
__device__ int64_t row_argmax(const uint16_t* __restrict__ row, int64_t vocab) {
  Best best{-INFINITY, vocab};  // an index past the row: loses every tie
  const bool vec = vocab % 8 == 0 && (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
  if (vec) {
    const uint4* rows8 = reinterpret_cast<const uint4*>(row);
    const int64_t n = vocab / 8;
    for (int64_t base = threadIdx.x; base < n; base += (int64_t)kThreads * kUnroll) {
      uint4 q[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = base + (int64_t)u * kThreads;
        q[u] = v < n ? rows8[v] : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = base + (int64_t)u * kThreads;
        if (v >= n) break;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const Best c{vec_get(q[u], j), v * 8 + j};
          if (better(c, best)) best = c;
        }
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const Best c{bf16_to_f32(row[i]), i};
      if (better(c, best)) best = c;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Best other = shuffle(best, offset);
    if (better(other, best)) best = other;
  }
  __shared__ Best warp_best[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(warp_best[w], best)) best = warp_best[w];
  }
  return best.index;
}

__global__ void __launch_bounds__(kThreads) pick_drafts_kernel(const uint16_t* __restrict__ logits, int rows,
                                                               int64_t vocab, const int64_t* __restrict__ control,
                                                               const int64_t* __restrict__ replay_drafts,
                                                               int64_t* __restrict__ block) {
  const int r = blockIdx.x;
  const int64_t best = row_argmax(logits + r * vocab, vocab);
  if (threadIdx.x == 0) {
    block[1 + r] = control[kReplay] > 0 ? replay_drafts[control[kStep] * rows + r] : best;
    if (r == 0) block[0] = control[kAnchor];
  }
}

__global__ void __launch_bounds__(kThreads) accept_block_kernel(const uint16_t* __restrict__ logits, int b,
                                                                int64_t vocab, const int64_t* __restrict__ block,
                                                                const int64_t* __restrict__ replay_accepted,
                                                                int64_t* control, int64_t* posterior, int64_t* out,
                                                                unsigned* counter) {
  const int r = blockIdx.x;
  const int64_t best = row_argmax(logits + r * vocab, vocab);
  if (threadIdx.x != 0) return;
  posterior[r] = best;
  __threadfence();                                   // this row before the count that publishes it
  if (atomicAdd(counter, 1u) != (unsigned)b - 1) return;
  __threadfence();
  *counter = 0;                                      // the last CTA: every row is in
  const volatile int64_t* post = posterior;          // other CTAs' writes: read through L2
  const int64_t start = control[kStart], vs = control[kVerifySize], max_length = control[kMaxLength],
                step = control[kStep];
  int64_t matched = 0;
  while (matched + 1 < b && matched + 1 < vs && block[matched + 1] == post[matched]) ++matched;
  const int64_t acc = control[kReplay] > 0 ? replay_accepted[step] : matched;
  const int64_t produced = min(acc + 1, max_length - start - 1);
  const int64_t last = produced <= acc ? block[min(produced, (int64_t)b - 1)] : post[acc];
  const int64_t after = start + produced;
  out[0] = matched;
  for (int j = 0; j < b; ++j) {
    out[1 + j] = block[j];
    out[1 + b + j] = post[j];
  }
  out[1 + 2 * b] = start;
  control[kStart] = after;
  control[kCtxStart] = start;
  control[kCtxCount] = produced;
  control[kVerifySize] = min(max_length - after, (int64_t)b);
  control[kAnchor] = last;
  control[kStep] = step + 1;
}

}  // namespace

int cuda_pick_drafts(const uint16_t* logits, int rows, int64_t vocab, const int64_t* control,
                     const int64_t* replay_drafts, int64_t* block, void* stream) {
  if (rows <= 0) return 0;
  pick_drafts_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logits, rows, vocab, control,
                                                                               replay_drafts, block);
  return (int)cudaGetLastError();
}

int cuda_accept_block(const uint16_t* logits, int block_size, int64_t vocab, const int64_t* block,
                      const int64_t* replay_accepted, int64_t* control, int64_t* posterior, int64_t* out,
                      unsigned* counter, void* stream) {
  if (block_size <= 0) return 0;
  accept_block_kernel<<<block_size, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, block_size, vocab, block, replay_accepted, control, posterior, out, counter);
  return (int)cudaGetLastError();
}

}  // namespace spec_step
}  // namespace specpilot
