// Programmatic dependent launch (sm_90) for the attention path: qk_norm_rope_cache, the decode
// attention split kernel and its combine. Each kernel lets its successor launch early and waits
// (griddepcontrol.wait) before touching its predecessor's outputs, so the launch and the first
// independent reads overlap the kernel before. On by default; one process-global flag, read at
// launch (so at graph capture), set through the decode_attention_pdl op from
// EngineConfig.attention_pdl. (The one-token GEMVs take theirs per call: EngineConfig.gemv_pdl.)
#pragma once

#include <atomic>

namespace specpilot {

inline std::atomic<bool>& attention_path_pdl() {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace specpilot
