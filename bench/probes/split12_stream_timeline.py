"""Where the split12 streamed GEMV's (csrc/cuda/split12_stream.cu, M = 1) time goes, per CTA, from
%globaltimer stamps: CTA start, after griddepcontrol.wait, x staged, first stage landed, last warp
done. Each variant is the shipped source with its constants substituted and the stamps inserted
(split12_stream_timeline.cu), built by nvcc into a shared library, checked bit for bit against the
package's split12_linear, then timed as bench/split12_kernels.py times (one CUDA graph over weight
copies > 256 MB, PDL on) and traced over one more replay of the same graph. Two sequences per
shape: the GEMV back to back ("alone") and after an add_rms_norm as in the engine ("norm+").
Needs the package built with CUDA and nvcc. One-off experiment, not part of the package:

    python bench/probes/split12_stream_timeline.py NAME=WARPS:DEPTH:MINBLOCKS:SMEM_KB[:STAGE_COLS[:MAXNREG]] ...

WARPS per CTA, DEPTH = the deepest ring (stages per warp), MINBLOCKS = __launch_bounds__' CTAs per
SM (2 caps registers so that the next kernel's CTA fits beside one), SMEM_KB = the CTA's shared
memory cap, STAGE_COLS = weight columns per stage (2048), MAXNREG = a register cap (__maxnreg__,
instead of MINBLOCKS; 0: none). The shipped kernel is 16:2:1:227. Prints, per shape and sequence, us per call and the
medians (ns) of the phases over the middle launches; "handoff" is, per SM, the next launch's CTA
start minus this launch's CTA end there (negative: they overlapped).
"""
import argparse
import ctypes
import math
import pathlib
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch

from skinny_tma_variants import set_constant
from split12_skinny_variants import check_weights
from specpilot.bench.timing import capture_graph, time_graph
from specpilot.formats.split12 import ops as split12_ops
from specpilot.ops.norm_rope import add_rms_norm

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
CHECK_SHAPES = ((1000, 72), (136, 4104), (6144, 4096), (4096, 12288))
REPS = 20
RECORD = 16  # u64 per CTA record (split12_stream_timeline.cu)
# Stamps: (anchor in the kernel's source, the text that replaces it).
STAMPS = (
    ("  pdl_launch_dependents();\n  // Stage g", "  PROBE_START();\n  pdl_launch_dependents();\n  // Stage g"),
    ("  pdl_wait();  // x may come from the previous kernel, y may still be read by it\n",
     "  pdl_wait();  // x may come from the previous kernel, y may still be read by it\n  PROBE_MARK(3);\n"),
    ("  __syncthreads();\n\n  float acc = 0.0f;", "  __syncthreads();\n  PROBE_MARK(4);\n\n  float acc = 0.0f;"),
    ("    sm90::mbar_wait(bars + slot_index * 8, phase);\n",
     "    sm90::mbar_wait(bars + slot_index * 8, phase);\n    if (g == 0) PROBE_MARK(5);\n"),
    ("      next = after;\n    }\n  }\n}\n", "      next = after;\n    }\n  }\n  PROBE_END();\n}\n"),
)


def variant_source(warps: int, depth: int, min_blocks: int, smem_kb: int, stage_cols: int = 2048,
                   max_regs: int = 0) -> str:
    src = (ROOT / "csrc/cuda/split12_stream.cu").read_text()
    for anchor, text in STAMPS:
        if src.count(anchor) != 1:
            raise SystemExit(f"split12_stream.cu changed: stamp anchor {anchor!r} is not there once")
        src = src.replace(anchor, text)
    bounds = "__launch_bounds__(kThreads, 1)"
    if src.count(bounds) != 1:
        raise SystemExit(f"split12_stream.cu changed: {bounds!r} is not there once")
    src = src.replace(bounds, f"__maxnreg__({max_regs})" if max_regs else f"__launch_bounds__(kThreads, {min_blocks})")
    # 1 KB below the cap for the stamps' static shared memory.
    for name, value in (("kWarps", warps), ("kRingDepth", depth), ("kMaxDepth", max(depth, 4)),
                        ("kStageCols", stage_cols), ("kCtaSmem", smem_kb * 1024 - 1024)):
        src = set_constant(src, name, value)
    return src


def build(name: str, spec: tuple, workdir: str):
    d = pathlib.Path(workdir) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "split12_stream.cu").write_text(variant_source(*spec))
    (d / "probe.cu").write_text((ROOT / "bench/probes/split12_stream_timeline.cu").read_text())
    cmd = ["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-shared", "-Xcompiler", "-fPIC",
           "-Xptxas", "-v", "-I", str(d), "-I", str(ROOT / "csrc/include"), "-I", str(ROOT / "csrc/cuda"),
           str(d / "probe.cu"), "-o", str(d / "probe.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"variant {name} does not compile:\n{done.stderr[-3000:]}")
    regs = [line.strip() for line in done.stderr.splitlines() if "registers" in line or "spill" in line]
    return ctypes.CDLL(str(d / "probe.so")), regs


def launcher(lib, planes, n: int, k: int, x, y):
    ptrs = (ctypes.c_void_p * 6)(*[t.data_ptr() for t in planes])

    def call():
        err = lib.probe_gemv(ptrs, n, k, ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"launch failed: cudaError {err}")
    return call


def check(lib, n: int, k: int) -> bool:
    g, w = check_weights(n, k)
    packed = split12_ops.pack(w)
    x = torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16)
    y = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launcher(lib, list(packed.planes().values()), n, k, x, y)()
    return torch.equal(y, split12_ops.split12_linear(x, packed))


def sequence_calls(lib, packed, n, k, x, y, with_norm: bool):
    """One call per weight copy: the GEMV, after an add_rms_norm writing its x when with_norm."""
    norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    calls = []
    for planes in packed:
        gemv = launcher(lib, planes, n, k, x, y)
        if with_norm:
            def call(gemv=gemv):
                add_rms_norm(h, None, norm_w, 1e-6)  # its output is not the GEMV's x: timing only
                gemv()
            calls.append(call)
        else:
            calls.append(gemv)
    return calls


def trace(lib, calls, packed, grid_guess: int):
    """One traced replay of the graph of `calls`: the records, as [CTAs, RECORD] int64 (ns)."""
    capacity = len(calls) * grid_guess * 2
    buf = torch.zeros(capacity * RECORD, dtype=torch.int64, device="cuda")
    graph = capture_graph(calls)
    graph.replay()
    torch.cuda.synchronize()
    if lib.probe_set_trace(ctypes.c_void_p(buf.data_ptr()), capacity):
        raise RuntimeError("probe_set_trace failed")
    graph.replay()
    torch.cuda.synchronize()
    lib.probe_set_trace(ctypes.c_void_p(0), 0)
    rec = buf.view(capacity, RECORD).cpu()
    rec = rec[rec[:, 2] != 0]
    order = {planes[0].data_ptr(): i for i, planes in enumerate(packed)}
    return rec, order


def summarize(rec, order) -> dict:
    launches = {}
    for r in rec.tolist():
        launches.setdefault(order[r[0]], []).append(r)
    idx = sorted(launches)
    middle = idx[2:-2] if len(idx) > 6 else idx
    med = statistics.median
    out = {"ctas": med(len(launches[i]) for i in middle)}
    phases = {"start->wait": (2, 3), "wait->x": (3, 4), "x->stage0": (4, 5), "start->stage0": (2, 5),
              "start->end": (2, 6)}
    for name, (a, b) in phases.items():
        out[name] = med(r[b] - r[a] for i in middle for r in launches[i] if r[b] and r[a])
    out["cycles start->end"] = med(r[11] for i in middle for r in launches[i])
    out["start spread"] = med(max(r[2] for r in launches[i]) - min(r[2] for r in launches[i]) for i in middle)
    out["end spread"] = med(max(r[6] for r in launches[i]) - min(r[6] for r in launches[i]) for i in middle)
    out["period"] = med(min(r[2] for r in launches[j]) - min(r[2] for r in launches[i]) for i, j in zip(middle, middle[1:]))
    gaps = []
    for i, j in zip(middle, middle[1:]):
        end_on = {r[1] >> 32: r[6] for r in launches[i]}
        gaps += [r[2] - end_on[r[1] >> 32] for r in launches[j] if r[1] >> 32 in end_on]
    out["handoff"] = med(gaps) if gaps else float("nan")
    out["handoff max"] = max(gaps) if gaps else float("nan")
    stamps = sorted({v for r in rec.tolist() for v in (r[2], r[3], r[4], r[5], r[6]) if v})
    diffs = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    out["timer step"] = min(diffs) if diffs else float("nan")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+", help="NAME=WARPS:DEPTH:MINBLOCKS:SMEM_KB[:STAGE_COLS[:MAXNREG]]")
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    specs = {v.split("=")[0]: tuple(map(int, v.split("=")[1].split(":"))) for v in args.variants}
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(8) as pool:
        built = dict(zip(specs, pool.map(lambda kv: build(kv[0], kv[1], workdir), specs.items())))
        for name, (_, regs) in built.items():
            print(name, specs[name], "|", "; ".join(regs[-2:]), flush=True)
        bad = [name for name, (lib, _) in built.items() if not all(check(lib, n, k) for n, k in CHECK_SHAPES)]
        print("bit-identical to split12_linear:", "all" if not bad else f"NOT {bad}", flush=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_bw = 2 * src.numel() / time_graph([lambda: dst.copy_(src)], REPS)
        print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
        table = {}  # (variant, sequence) -> {shape: us}
        for shape in args.shapes.split(","):
            n, k = SHAPES[shape]
            copies = max(1, math.ceil(256e6 / (1.5 * n * k)))
            packed = [list(split12_ops.pack((torch.randn(n, k, generator=g, device="cuda") * k ** -0.5)
                                            .to(torch.bfloat16)).planes().values()) for _ in range(copies)]
            stored = sum(t.numel() * t.element_size() for t in packed[0])
            x = torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16)
            y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            print(f"\n{shape} {n}x{k}: {stored / 1e6:.1f} MB stored, at copy bandwidth "
                  f"{1e6 * stored / copy_bw:.1f} us", flush=True)
            for name, (lib, _) in built.items():
                for seq in ("alone", "norm+"):
                    calls = sequence_calls(lib, packed, n, k, x, y, seq == "norm+")
                    us = 1e6 * time_graph(calls, REPS)
                    table.setdefault((name, seq), {})[shape] = us
                    rec, order = trace(lib, calls, packed, 132)
                    s = summarize(rec, order)
                    print(f"  {name:8s} {seq:6s} {us:6.1f} us | " + " ".join(
                        f"{key}={value:.0f}" for key, value in s.items()), flush=True)
            del packed
            torch.cuda.empty_cache()
        shapes = args.shapes.split(",")
        print("\n| variant | sequence | " + " | ".join(shapes) + " | sum |\n|---|---|" + "---|" * (len(shapes) + 1))
        for (name, seq), row in table.items():
            print(f"| {name} | {seq} | " + " | ".join(f"{row[s]:.1f}" for s in shapes) + f" | {sum(row.values()):.1f} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
