"""Where a decode step's GPU time goes (H200 probe for the engine-speed work):

    python -m specpilot.bench.profile_engine_steps [--compile] [--layers N]

Random Qwen3-8B-shape target (bf16, `--layers` decoder layers, default 36): top kernels of one
eager T=1 step and one T=16 step (torch.profiler, CUDA time), kernels per layer, and the graphed
step times; with --compile also compile_layers=True (torch.compile per decoder layer, inside the
graphs) with its compile time. Prints tables only.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch


def top_kernels(fn, n: int = 12):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events)
    count = sum(e.count for e in events)
    print(f"  {count} kernels, {total / 1e3:.3f} ms GPU time")
    for e in events[:n]:
        print(f"  {e.device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:110]}")


def graphed_ms(engine, t: int, iters: int = 30) -> float:
    runner = engine.runner
    ids = torch.randint(0, 1000, (1, t), device="cuda")
    fn = lambda: runner.target_step(ids, 512, with_features=False)
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


@torch.inference_mode()
def main(argv=None) -> int:
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--no-profile", action="store_true", help="skip the eager kernel tables")
    p.add_argument("--backends", default="auto,efficient,matmul", help="attention backends to time (graphed)")
    args = p.parse_args(argv)
    from specpilot.models.attention_backend import set_attention_backend
    cfg = replace(TARGET_PRESETS["qwen3-8b"], num_layers=args.layers)
    target = random_target(cfg, "cuda", torch.bfloat16, seed=0)
    eng = Engine(target, None, max_seq_len=1024, cuda_graphs=True)
    prompt = torch.randint(0, 1000, (1, 512), device="cuda")
    eng.runner.prefill(prompt, with_features=False)
    for t in (1, 16) if not args.no_profile else ():
        ids = torch.randint(0, 1000, (1, t), device="cuda")
        pos = torch.arange(512, 512 + t, device="cuda")
        print(f"eager T={t}, {args.layers} layers:")
        top_kernels(lambda: target(ids, pos, eng.cache, 1024))
    for backend in [b for b in args.backends.split(",") if b]:
        set_attention_backend(backend)
        e = Engine(target, None, max_seq_len=1024, cuda_graphs=True)
        e.runner.prefill(prompt, with_features=False)
        print(f"attention {backend:<10} graphed T=1 {graphed_ms(e, 1):.3f} ms, T=16 {graphed_ms(e, 16):.3f} ms")
        del e
    set_attention_backend("auto")
    if args.compile:
        from specpilot.engine.engine import compile_decoder_layers

        eng2 = Engine(target, None, max_seq_len=1024, cuda_graphs=True)
        compile_decoder_layers(target)
        eng2.runner.prefill(prompt, with_features=False)
        for t in (1, 16):
            t0 = time.perf_counter()
            graphed_ms(eng2, t, iters=1)
            print(f"compiled graphed T={t}: compile+capture {time.perf_counter() - t0:.1f} s, "
                  f"{graphed_ms(eng2, t):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
