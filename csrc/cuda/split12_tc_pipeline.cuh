// Tensor-core linear, pipelined (kernel generation 1). Included by split12_tc.cu inside its
// namespace, after its helpers (mma_bf16, zero_past_k, load_x, kWarps, kTileRows).
//
// Exactness: the same blocks, warps, spans, fragments and mma sequence as tc_linear_kernel, hence
// the same output bits as it (and split12 == bf16 twin, M-invariant, as there). Only the loads move.
//
// Why: tc_linear_kernel keeps one span (2 rows x 48 bytes per lane) in flight per warp, ~49 KB per
// SM at 2 blocks/SM, and waits a full HBM latency per span. Here each lane cp.asyncs the raw words
// of its next kStages-1 spans into its own slots of a per-warp ring in shared memory (no lane ever
// reads another lane's slots, so the lane's own cp.async.wait_group is the only sync needed);
// registers still hold one span, so 2 blocks/SM keep fitting: ~150 KB per SM in flight (stages 4).
#pragma once

// 16-byte global -> shared copy that does not block (cp.async.cg: L2 only, like the streaming
// loads). Host builds (the g++ emulation test) copy at once, so there commit/wait are no-ops.
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
#if defined(__CUDA_ARCH__)
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *smem = *gmem;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kPending>  // wait until at most kPending of this thread's groups are still in flight
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// The ring of stages: dynamic shared memory (the emulation test supplies a host buffer).
__device__ __forceinline__ uint4* tc_stage_ring() {
#if defined(__CUDACC__)
  extern __shared__ uint4 split12_tc_ring[];
  return split12_tc_ring;
#else
  return split12_host_dynamic_smem();
#endif
}

// Shared memory of the ring: [warp][stage][row h][raw word][lane] uint4, lane innermost so the
// 16-byte accesses of a warp are contiguous (no bank conflicts).
template <class Source, int kStages>
constexpr int tc_ring_bytes() {
  return kWarps * kStages * 2 * Source::kRawWords * 32 * 16;
}

template <class Source, int NT, int kStages>  // NT token tiles of 8: M <= 8 * NT
__global__ void __launch_bounds__(kWarps * 32, NT <= 2 ? 2 : 1)
    tc_pipelined_kernel(Source src, const uint16_t* x, int M, uint16_t* y, int N, int K, bool xvec) {
  pdl_launch_dependents();  // no-op unless the next kernel was launched with PDL
  constexpr int kWords = Source::kRawWords;
  constexpr int kSlot = 2 * kWords * 32;  // uint4 per warp per stage
  __shared__ float partial[kWarps][NT * 8][kTileRows];  // per warp: [token][row]
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kTileRows;
  uint4* ring = tc_stage_ring() + warp * kStages * kSlot;
  const int n_rows[2] = {row0 + g < N ? row0 + g : N - 1, row0 + g + 8 < N ? row0 + g + 8 : N - 1};
  typename Source::Row rows[2];  // plane pointers now, base / escape tables after the prologue
  rows[0] = src.row_planes(n_rows[0]);
  rows[1] = src.row_planes(n_rows[1]);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  const int nchunks = (K + kChunk - 1) / kChunk;
  const int nspans = (nchunks + 3) / 4;
  const int my_spans = warp < nspans ? (nspans - warp + kWarps - 1) / kWarps : 0;  // spans warp, warp+8, ...

  // Issue the copies of this warp's i-th span into stage i % kStages. One commit group per i, even
  // when empty, so "group i has landed" is always cp_async_wait<kStages - 1> in iteration i.
  auto issue = [&](int i) {
    const int c = 4 * (warp + i * kWarps) + t;
    if (i < my_spans && c < nchunks) {
      const bool full = c * kChunk + kChunk <= K;
      uint4* slot = ring + (i % kStages) * kSlot;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p[kWords];
        if (src.raw_src(rows[h], c, full, p)) {
#pragma unroll
          for (int wi = 0; wi < kWords; ++wi) cp_async16(slot + (h * kWords + wi) * 32 + lane, p[wi]);
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  pdl_wait();  // weights are in flight; x (and y) may belong to the previous kernel until here
  src.row_tables(rows[0], n_rows[0]);  // dependent loads: after the copies are issued
  src.row_tables(rows[1], n_rows[1]);
  for (int i = 0; i < my_spans; ++i) {  // warp-uniform: every lane reaches every mma
    issue(i + kStages - 1);  // refills the stage span i-1 used (already in registers)
    const int c = 4 * (warp + i * kWarps) + t;
    const bool live = c < nchunks;
    const int col0 = c * kChunk;
    const bool full = col0 + kChunk <= K;
    cp_async_wait<kStages - 1>();  // this lane's copies of span i have landed
    uint32_t wa[16], wb[16];       // rows g and g+8
    if (live) {
      const uint4* slot = ring + (i % kStages) * kSlot;
      typename Source::Raw ra, rb;
#pragma unroll
      for (int wi = 0; wi < kWords; ++wi) {
        ra.u[wi] = slot[wi * 32 + lane];
        rb.u[wi] = slot[(kWords + wi) * 32 + lane];
      }
      src.decode(rows[0], c, full, K, ra, wa);
      src.decode(rows[1], c, full, K, rb, wb);
      if (!full) {
        zero_past_k(wa, col0, K);
        zero_past_k(wb, col0, K);
      }
    } else {
#pragma unroll
      for (int i2 = 0; i2 < 16; ++i2) wa[i2] = wb[i2] = 0u;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t xw[16];
      if (live) {
        load_x(x, 8 * j + g, M, K, col0, full && xvec, xw);
      } else {
#pragma unroll
        for (int i2 = 0; i2 < 16; ++i2) xw[i2] = 0u;
      }
      __syncwarp();  // mma.sync.aligned: the whole warp, converged
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)  // k-step ks: this lane's columns 4ks .. 4ks+3 of the chunk
        mma_bf16(acc[j], wa[2 * ks], wb[2 * ks], wa[2 * ks + 1], wb[2 * ks + 1], xw[2 * ks], xw[2 * ks + 1]);
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight at exit

  // C fragment: c0/c1 = row g, tokens 2t/2t+1 of the tile; c2/c3 = row g+8. Same epilogue as
  // tc_linear_kernel (fixed order over warps).
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    partial[warp][8 * j + 2 * t][g] = acc[j][0];
    partial[warp][8 * j + 2 * t + 1][g] = acc[j][1];
    partial[warp][8 * j + 2 * t][g + 8] = acc[j][2];
    partial[warp][8 * j + 2 * t + 1][g + 8] = acc[j][3];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTileRows * M; idx += kWarps * 32) {
    const int r = idx % kTileRows, n = idx / kTileRows;
    if (row0 + r >= N) continue;
    float sum = partial[0][n][r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum = sum + partial[w][n][r];
    y[(int64_t)n * N + row0 + r] = f32_bits_to_bf16_rne(__float_as_uint(sum));
  }
}
