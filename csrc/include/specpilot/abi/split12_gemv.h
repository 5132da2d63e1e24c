// NVRTC launch contract of split12_gemv (M = 1), the op the agent loop writes variants of.
//
// A variant is one CUDA source that defines exactly
//
//   extern "C" __global__ void split12_gemv(
//       const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
//       const int* esc_rowptr, const int* esc_col, const unsigned short* esc_val,
//       const unsigned short* x, unsigned short* y, int N, int K, int kpad);
//
// Arguments: the split12 format v1 planes of W [N, K] (specpilot/split12_format.h), x [K] and
// y [N] as raw bf16 bits, kpad = round_up(K, 32). Planes come from torch allocations (256-byte
// aligned base pointers; lo rows are kpad bytes, codes rows kpad/2 bytes, so 16-byte loads of
// both planes are aligned). x is 16-byte aligned when K % 8 == 0 (check the pointer anyway).
//
// Launch: grid = ceil(N / SPLIT12_GEMV_ROWS_PER_BLOCK) blocks of SPLIT12_GEMV_THREADS threads,
// no dynamic shared memory, on the caller's stream (CUDA-graph capturable: no allocation, no sync).
// A variant that wants another geometry defines both macros itself before including this header
// and exports them (NVRTC only),
//   extern "C" __constant__ int split12_gemv_geometry[2] = {threads, rows_per_block};
// the JIT launcher reads that symbol back (absent: the defaults below).
// NVRTC include paths: -I csrc/include -I csrc/cuda (the kernel body is csrc/cuda/split12_kernel.cuh).
//
// Exactness (the gate checks it): y must be bit-identical to specpilot.bf16_linear on unpack(W),
// i.e. keep the reduction order of split12_format.h (lane-strided 32-column chunks over 32 lanes,
// one fmaf chain per lane, escapes substituted in place, butterfly tree, bf16 round-to-nearest-even).
#pragma once

#include "specpilot/split12_format.h"

#ifndef SPLIT12_GEMV_THREADS
#define SPLIT12_GEMV_THREADS 128
#endif
#ifndef SPLIT12_GEMV_ROWS_PER_BLOCK
#define SPLIT12_GEMV_ROWS_PER_BLOCK 4  // 1 row per warp: the most warps for the small layer shapes
#endif
// Not part of the launch contract (no launch depends on it): chunks per lane fetched before the
// first is used, i.e. 48 * SPLIT12_GEMV_UNROLL bytes in flight per lane and row.
#ifndef SPLIT12_GEMV_UNROLL
#define SPLIT12_GEMV_UNROLL 4
#endif
