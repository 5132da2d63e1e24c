"""The gaps the loop works on: built from the cost model (or explicit GEMV shapes), each with its
incumbent (best known variant), ceiling and time lost per token; plus the deployment key and the
transfer of validated mechanisms from the nearest other deployment."""
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.agents.candidates import Candidate, gemv_candidate

GEMV_OP, KNOB_OP = "split12_gemv", "engine.block_size"


def gemv_bytes(n: int, k: int) -> float:
    kpad = (k + 31) // 32 * 32
    return n * kpad * 1.5 + n + 2 * k + 2 * n  # planes + base + x + y (escapes: a fraction of a percent)


def _dir_id(path) -> str:
    if not path:
        return "none"
    p = Path(path)
    cfg = p / "config.json"
    digest = hashlib.sha256(cfg.read_bytes()).hexdigest()[:8] if cfg.exists() else "nocfg"
    return f"{p.resolve().name}@{digest}"


def gpu_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return "cpu"


def deployment_key(cfg):
    info = {"gpu": gpu_name(cfg.device), "target": _dir_id(cfg.target_dir), "drafter": _dir_id(cfg.drafter_dir),
            "batch": cfg.batch, "block_size": cfg.block_size, "device": cfg.device}
    key = f"{info['gpu']}|{info['target']}|{info['drafter']}|b{cfg.batch}|bs{cfg.block_size or 'default'}"
    return key, info


def load_or_measure_gaps(memory, run_id, deployment, cfg, log):
    rows = memory.gaps(run_id)
    if rows:
        return rows[0].get("copy_bandwidth"), rows
    from specpilot.cost import cost_report, measure_ceilings

    if cfg.shapes:
        ceil = measure_ceilings(cfg.device, quick=cfg.quick_cost)
        rows = []
        for name, n, k, count in cfg.shapes:
            c = gemv_bytes(n, k) / ceil.copy_bandwidth
            rows.append({"key": f"decode:{name}:1x{n}x{k}", "step": "decode", "name": name, "kind": "linear",
                         "op": GEMV_OP, "shape": [n, k], "count": count, "measured_s": None, "ceiling_s": c,
                         "lost_per_token_s": c * count, "tokens_per_step": float(cfg.batch), "actionable": True})
    else:
        report = cost_report(cfg.target_dir, cfg.drafter_dir, batch=cfg.batch, block_size=cfg.block_size,
                             device=cfg.device, quick=cfg.quick_cost)
        ceil, rows = report.ceilings, report.rows
    for r in rows:
        r["copy_bandwidth"] = ceil.copy_bandwidth
    memory.record_gaps(run_id, deployment, rows)
    log(f"gaps: {sum(1 for r in rows if r['actionable'])} actionable of {len(rows)}; copy bandwidth "
        f"{ceil.copy_bandwidth / 1e9:.1f} GB/s on {ceil.device_name}")
    return ceil.copy_bandwidth, rows


@dataclass
class Gap:
    key: str
    op: str
    shape: tuple
    per_token: float              # instances per generated token
    ceiling_s: float
    measured_s: float | None      # the cost model's number, before any round
    incumbent: Candidate | None = None
    best_time: float | None = None
    first_time: float | None = None
    stale: int = 0
    pending_transfers: list = field(default_factory=list)

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape)) or "-"

    @property
    def incumbent_label(self) -> str:
        return self.incumbent.label if self.incumbent is not None else "none"

    @property
    def best_text(self) -> str:
        t = f"{self.best_time * 1e6:.2f} us" if self.best_time else "unmeasured"
        return f"{self.incumbent_label} {t} (ceiling {self.ceiling_s * 1e6:.2f} us)"

    def lost(self) -> float:
        t = self.best_time if self.best_time is not None else self.measured_s
        if t is None:
            t = 10 * self.ceiling_s  # unmeasured: assume far from the ceiling, bigger shapes first
        return max(0.0, t - self.ceiling_s) * self.per_token * (0.5 ** self.stale)

    def incumbent_candidate(self):
        return self.incumbent

    def observe(self, cand, t, improved: bool, before=None) -> None:
        """After a round: the incumbent (or the winner) and its time measured in that round."""
        if self.first_time is None:
            self.first_time = before if before is not None else t
        self.stale = 0 if improved else self.stale + 1
        if cand is not None and t is not None:
            self.incumbent, self.best_time = cand, t


class GapState:
    def __init__(self, rows, copy_bw, cfg):
        from specpilot.agents.timing import SYNTHETIC_BANDWIDTH

        self.cfg = cfg
        fake = cfg.timer.get("kind") == "fake"
        self.roofline_bandwidth = SYNTHETIC_BANDWIDTH if fake else copy_bw
        self.gaps = {}
        for r in rows:
            if not r["actionable"] or r["op"] not in cfg.ops:
                continue
            shape = tuple(r["shape"])
            key = f"{r['op']}:{'x'.join(map(str, shape)) or 'engine'}"
            tokens = r.get("tokens_per_step") or 1.0
            if r["op"] == GEMV_OP:
                ceiling = gemv_bytes(*shape) / self.roofline_bandwidth
                measured = None if fake else r.get("measured_s")
            else:
                ceiling, measured = r["ceiling_s"], r["measured_s"]
            if key in self.gaps:
                self.gaps[key].per_token += r["count"] / tokens
                continue
            self.gaps[key] = Gap(key, r["op"], shape, r["count"] / tokens, ceiling, measured)

    def gap(self, key: str) -> Gap:
        if key not in self.gaps:
            raise RuntimeError(f"resume: round refers to gap {key!r}, not in this run's gap table")
        return self.gaps[key]

    def next_gap(self, knob_evaluator):
        live = [g for g in self.gaps.values() if g.op != KNOB_OP or knob_evaluator is not None]
        return max(live, key=lambda g: g.lost()) if live else None

    def seed_incumbents(self, memory, deployment, run_id, log) -> None:
        """Best known here, else the naive start; plus the nearest deployment's mechanism to try."""
        mine = {(m["op"], tuple(m["shape"])): m for m in memory.mechanisms(deployment)}
        others = [m for m in memory.mechanisms() if m["deployment"] != deployment]
        started = {r["gap_key"] for r in memory.rounds(run_id)}
        for g in self.gaps.values():
            m = mine.get((g.op, g.shape))
            g.incumbent = memory.candidate(m["cand_id"]) if m else None
            if g.incumbent is None:
                g.incumbent = self._start(g)
            if m is None and g.key not in started:
                t = self._transfer(g, others, deployment, memory)
                if t is not None:
                    cand, src = t
                    memory.record_transfer(run_id, g.op, g.shape, src, cand.cand_id)
                    g.pending_transfers.append(cand)
                    log(f"transfer: {g.key} will try {cand.label} from {src}")

    def _start(self, g: Gap):
        if g.op == GEMV_OP:
            return gemv_candidate(g.shape, {}, "incumbent", self.cfg.device)  # the naive kernel
        return Candidate(KNOB_OP, (), "knob", "incumbent", {"block_size": self.cfg.block_size or 16}, None,
                         f"block_size={self.cfg.block_size or 16}")

    def _transfer(self, g: Gap, others, deployment, memory):
        same_op = [m for m in others if m["op"] == g.op]
        if not same_op:
            return None
        gpu = deployment.split("|")[0]

        def distance(m):
            d = 0.0 if m["deployment"].split("|")[0] == gpu else 4.0
            if g.op == GEMV_OP and len(m["shape"]) == 2:
                d += abs(math.log2(m["shape"][0] / g.shape[0])) + abs(math.log2(m["shape"][1] / g.shape[1]))
            return d

        m = min(same_op, key=distance)
        src = memory.candidate(m["cand_id"])
        if src is None:
            return None
        if g.op == GEMV_OP:
            if src.kind == "cuda" and src.proposer.startswith("llm") and self.cfg.device == "cuda":
                cand = Candidate(g.op, g.shape, "cuda", "transfer", dict(src.params), src.source, src.label)
            else:
                cand = gemv_candidate(g.shape, src.params, "transfer", self.cfg.device)
        else:
            cand = Candidate(g.op, (), "knob", "transfer", dict(src.params), None, src.label)
        return cand, m["deployment"]

    def replay_round(self, memory, run_id, row) -> None:
        g = self.gaps.get(row["gap_key"])
        if g is None:
            return
        winner = memory.candidate(row["winner"]) if row["winner"] else None
        g.observe(winner or g.incumbent, row["after_s"], winner is not None, row["before_s"])

    def summary(self) -> list:
        return [{"gap": g.key, "op": g.op, "shape": list(g.shape), "first_s": g.first_time, "best_s": g.best_time,
                 "best": g.incumbent_label, "ceiling_s": g.ceiling_s} for g in self.gaps.values()]

