// Host-side launch of the split12 kernels, the one-token GEMVs (gemv_m1.cu) and qk_norm_rope_cache,
// plain or with programmatic dependent launch (PDL, sm_90): with pdl the kernel may start while
// the previous kernel of the stream still runs; the kernels issue their independent loads, then
// griddepcontrol.wait before reading what the previous kernel writes. Legal under CUDA-graph
// capture (the edge becomes a programmatic dependency). Returns a cudaError_t. sm_count(): the
// persistent grids' size.
#pragma once

#include <cuda_runtime.h>

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {

// SMs of the current device (cached; 132 on an H200 if the query fails).
inline int sm_count() {
  static int count = 0;
  if (count == 0) {
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    if (count <= 0) count = 132;
  }
  return count;
}

template <class... Params, class... Args>
int launch_kernel(void (*kernel)(Params...), dim3 grid, int block, int smem, cudaStream_t stream, bool pdl,
                  Args... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return (int)cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace split12
}  // namespace specpilot
