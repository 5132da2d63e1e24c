"""`specpilot verify --concurrency N`: the batched engine's outputs through the same verdict.

Two batched runs of every prompt at concurrency N: with full-block verification (its output and
acceptance lengths go through token_force as "our speculative output", judged by verdict.py's rule
against stock, our AR output and the referee, acceptance step for step in fp32), and with every
batching mechanism on (adaptive verify changes the acceptance lengths, never the tokens). Both
must equal the single-request engine's output per request: in fp32 exactly (else the verdict fails);
in bf16 the batch's other GEMM shapes may fork a near-tie, so the count is reported, and the verdict
of the full-verify run against stock and the referee is what judges it.
"""
from __future__ import annotations

import torch

from specpilot.engine.batch import BatchConfig
from specpilot.engine.batch.run import run_batch


def batched_runs(engine, prompts, max_new_tokens, concurrency, stop_ids, block_size, options=None) -> tuple:
    """(full-verify results, all-mechanisms results), in prompt order; options: more BatchConfig
    fields of the all-mechanisms run (e.g. verify_prefix)."""
    common = dict(stop_ids=stop_ids, block_size=block_size, engine_config=engine.config)
    full, _ = run_batch(engine.target, engine.drafter, prompts, max_new_tokens, concurrency,
                        config=BatchConfig(adaptive_verify=False), **common)
    mechanisms, _ = run_batch(engine.target, engine.drafter, prompts, max_new_tokens, concurrency,
                              config=BatchConfig(**(options or {})), **common)
    return full, mechanisms


def judge_batched(report, engine, prompts, ids, max_new_tokens, concurrency, full, mechanisms, stop_ids,
                  block_size) -> dict:
    """Compares both batched runs with the single-request engine per prompt; in fp32 a difference is a
    verdict failure (report.reasons, report.passed). Returns the summary for the JSON line."""
    single = [engine.generate_spec(list(map(int, p)), max_new_tokens, stop_ids=stop_ids, block_size=block_size)
              for p in prompts]
    differ = {"full-verify": [ids[i] for i, (a, b) in enumerate(zip(full, single)) if a.tokens != b.tokens],
              "all-mechanisms": [ids[i] for i, (a, b) in enumerate(zip(mechanisms, single)) if a.tokens != b.tokens]}
    judged = engine.target.dtype == torch.float32
    for run, bad in differ.items():
        if bad and judged:
            report.reasons.append(f"batched ({run}, concurrency {concurrency}) output differs from the single-request "
                                  f"engine's on prompts {bad[:5]} (fp32: must be identical)")
    report.passed = not report.reasons
    return {"concurrency": concurrency, "judged": judged, "prompts": len(prompts),
            "identical_full_verify": len(prompts) - len(differ["full-verify"]),
            "identical_all_mechanisms": len(prompts) - len(differ["all-mechanisms"]),
            "differ": differ, "tau_all_mechanisms": sum(r.tau for r in mechanisms) / max(len(mechanisms), 1)}
