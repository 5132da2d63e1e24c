"""One dispatch layer per op family, each with its torch reference beside it: the models call these.

  linear.py     linears by token rows: the one-token fused GEMV, the skinny GEMM, else torch
  attention.py  attend / attention_mask: our split-KV decode kernel, else SDPA
  norm_rope.py  add_rms_norm, qk_norm_rope_cache, silu_mul: fused CUDA kernels, else eager torch
Every choice reads the running EngineConfig (specpilot.config.current()), which the Engine hands down.
"""
