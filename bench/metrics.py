"""Numbers of the report, computed from JSONL rows exactly as dflash 0.1.0's benchmark does.

- tokens/s of a method = 1 / mean over prompts of (decode_s / new tokens)   ("throughput")
- speedup of A over B  = mean time/token of B / mean time/token of A, on the prompts both ran
- tau = mean over prompts (with >= 1 verify step) of the mean acceptance length (bonus included)
- histogram = share of all verify steps that produced 1, 2, ... block_size tokens
- agreement of A with B = number of prompts whose new tokens are identical
"""
import statistics

# (method, baseline) pairs reported as speedups; stock over hf_ar is dflash's own "Decoding speedup".
# Our methods stand for each of their weight formats ("our_spec@split12", see e2e.our_method).
SPEEDUPS = (("our_spec", "hf_ar"), ("our_spec", "our_ar"), ("stock", "hf_ar"), ("our_ar", "hf_ar"),
            ("our_spec", "hf_static"), ("our_spec", "stock"))
AGREEMENTS = (("our_spec", "stock"), ("our_ar", "hf_ar"), ("our_ar", "hf_static"))
OURS = ("our_ar", "our_spec")  # in a run over several formats, each later format's is also compared with the first's


def base_and_format(name: str) -> tuple[str, str | None]:
    """"our_spec@split12" -> ("our_spec", "split12"); "hf_static" -> ("hf_static", None)."""
    base, _, fmt = name.partition("@")
    return base, (fmt or None)


def pairs(table, methods: list[str]) -> list[tuple[str, str]]:
    """The pairs of `table` among `methods` (in run order): a method of one format pairs with the
    HF methods and with ours of the same format; then each later format's our_ar / our_spec with
    the first format's."""
    out = []
    for a, b in table:
        for m in methods:
            for n in methods:
                (ma, fa), (nb, fb) = base_and_format(m), base_and_format(n)
                if ma == a and nb == b and (fa is None or fb is None or fa == fb):
                    out.append((m, n))
    for base in OURS:
        mine = [m for m in methods if base_and_format(m)[0] == base and base_and_format(m)[1]]
        out += [(m, mine[0]) for m in mine[1:]]
    return out


def _key(row) -> tuple:
    return (row["benchmark"], row["sample_id"], row["turn"])


def tau(rows: list[dict]) -> float | None:
    per_prompt = [statistics.mean(r["acceptance_lengths"]) for r in rows if r.get("acceptance_lengths")]
    return statistics.mean(per_prompt) if per_prompt else None


def histogram(rows: list[dict], block_size: int) -> list[int]:
    """counts[i] = verify steps that produced i+1 tokens, i in 0..block_size-1."""
    counts = [0] * block_size
    for r in rows:
        for a in r.get("acceptance_lengths") or ():
            if not 1 <= a <= block_size:
                raise ValueError(f"acceptance length {a} outside 1..{block_size} "
                                 f"({r['benchmark']} {r['sample_id']} {r['method']})")
            counts[a - 1] += 1
    return counts


def mean_tpot(rows: list[dict]) -> float | None:
    tpots = [r["time_per_token_s"] for r in rows if r.get("time_per_token_s")]
    return statistics.mean(tpots) if tpots else None


def method_summary(rows: list[dict]) -> dict | None:
    """Summary of one method's rows (None when it has none)."""
    if not rows:
        return None
    tpot = mean_tpot(rows)
    return {"prompts": len(rows), "new_tokens": sum(r["new_tokens"] for r in rows),
            "mean_time_per_token_s": tpot, "tokens_per_s": (1.0 / tpot) if tpot else float("nan"),
            "tau": tau(rows),
            "replay_shortfalls": (sum(r["replay_shortfalls"] for r in rows)
                                  if any(r.get("replay_shortfalls") is not None for r in rows) else None)}


def speedup(rows: list[dict], method: str, baseline: str) -> float | None:
    """Mean tpot of `baseline` / mean tpot of `method`, over the prompts both ran (None if none)."""
    a = {_key(r): r for r in rows if r["method"] == method and r.get("time_per_token_s")}
    b = {_key(r): r for r in rows if r["method"] == baseline and r.get("time_per_token_s")}
    common = sorted(a.keys() & b.keys())
    if not common:
        return None
    return (statistics.mean(b[k]["time_per_token_s"] for k in common)
            / statistics.mean(a[k]["time_per_token_s"] for k in common))


def agreement(rows: list[dict], method: str, other: str) -> tuple[int, int] | None:
    """(prompts with identical new tokens, prompts both ran), or None if they share none."""
    a = {_key(r): r["tokens"] for r in rows if r["method"] == method}
    b = {_key(r): r["tokens"] for r in rows if r["method"] == other}
    common = a.keys() & b.keys()
    if not common:
        return None
    return sum(a[k] == b[k] for k in common), len(common)


def benchmark_summary(rows: list[dict], block_size: int) -> dict:
    """Everything the report shows for one set of rows (one benchmark, or all pooled)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))  # run order
    spec_rows = {m: [r for r in rows if r["method"] == m and r.get("acceptance_lengths")] for m in methods}
    return {
        "methods": {m: method_summary([r for r in rows if r["method"] == m]) for m in methods},
        "histograms": {m: histogram(spec_rows[m], block_size) for m in methods if spec_rows[m]},
        "speedups": {f"{m}/{b}": speedup(rows, m, b) for m, b in pairs(SPEEDUPS, methods)},
        "agreement": {f"{m}/{b}": agreement(rows, m, b) for m, b in pairs(AGREEMENTS, methods)},
    }


def summarize(rows: list[dict], block_size: int) -> dict:
    """{benchmark: summary} in first-seen order, plus "all" pooling every prompt when > 1 benchmark."""
    names = list(dict.fromkeys(r["benchmark"] for r in rows))
    out = {n: benchmark_summary([r for r in rows if r["benchmark"] == n], block_size) for n in names}
    if len(names) > 1:
        out["all"] = benchmark_summary(rows, block_size)
    return out
