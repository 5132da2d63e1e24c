"""Built-in search over the split12 GEMV template's parameters and the engine's knobs (no LLM).

Agents with an even index search locally (one parameter one step away from the best passing
variant), odd ones explore (random untried points), so K agents cover both. Deterministic for a
given (seed, round, agent): a resumed run regenerates nothing anyway (proposals are recorded).
"""
import random

from specpilot.agents.candidates import Candidate, gemv_candidate, gemv_geometry
from specpilot.agents.proposers import ProposalContext

SPACE = {
    "threads_per_row": (8, 16, 32, 64, 128, 256),
    "rows_per_block": (1, 2, 4, 8, 16),
    "vec_groups": (1, 2, 4),
    "unroll": (1, 2, 4),
}
# a spread first design: warp-per-row and sub-warp rows, 1/2/4 groups per load
START = [
    {"threads_per_row": 32, "rows_per_block": 4, "vec_groups": 2, "unroll": 1},
    {"threads_per_row": 16, "rows_per_block": 8, "vec_groups": 2, "unroll": 2},
    {"threads_per_row": 64, "rows_per_block": 2, "vec_groups": 4, "unroll": 1},
    {"threads_per_row": 128, "rows_per_block": 1, "vec_groups": 2, "unroll": 1},
    {"threads_per_row": 32, "rows_per_block": 8, "vec_groups": 1, "unroll": 4},
    {"threads_per_row": 8, "rows_per_block": 16, "vec_groups": 4, "unroll": 1},
]
BLOCK_SIZES = (2, 4, 6, 8, 10, 12, 16)


def _valid(p: dict) -> bool:
    try:
        gemv_geometry(p).validate()
    except ValueError:
        return False
    return True


def _key(p: dict) -> tuple:
    return tuple(int(p.get(k, 0)) for k in SPACE)


class BuiltinProposer:
    name = "builtin"

    def propose(self, ctx: ProposalContext) -> list:
        if ctx.op == "engine.block_size":
            return self._knobs(ctx)
        tried = {_key(c.params) for c, *_ in ctx.history if c.op == ctx.op}
        rng = random.Random(ctx.seed * 1_000_003 + ctx.round * 7919 + ctx.agent_index)
        best = self._best_tiled(ctx)
        if ctx.agent_index % 2 == 0 and best is not None:
            pool = self._neighbours(best)
            rng.shuffle(pool)
        elif best is None and ctx.agent_index % 2 == 0:
            pool = list(START)
        else:
            pool = [self._random_point(rng) for _ in range(200)]
        out, seen = [], set(tried)
        for p in pool:
            if _valid(p) and _key(p) not in seen:
                seen.add(_key(p))
                out.append(gemv_candidate(ctx.shape, p, self.name, ctx.device))
            if len(out) == ctx.n:
                break
        return out

    def _best_tiled(self, ctx: ProposalContext):
        passing = [(t, c.params) for c, ok, t, _ in ctx.history
                   if ok and t is not None and c.params.get("threads_per_row") and c.kind != "knob"]
        inc = ctx.incumbent
        if inc is not None and inc.params.get("threads_per_row") and ctx.incumbent_time_s is not None:
            passing.append((ctx.incumbent_time_s, inc.params))
        return min(passing, key=lambda tp: tp[0])[1] if passing else None

    def _neighbours(self, best: dict) -> list:
        out = []
        for k, values in SPACE.items():
            i = values.index(best[k]) if best.get(k) in values else 0
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    out.append({**{kk: best[kk] for kk in SPACE}, k: values[j]})
        return out

    def _random_point(self, rng: random.Random) -> dict:
        return {k: rng.choice(v) for k, v in SPACE.items()}

    def _knobs(self, ctx: ProposalContext) -> list:
        tried = {c.params.get("block_size") for c, *_ in ctx.history}
        current = (ctx.incumbent.params.get("block_size") if ctx.incumbent else None) or 16
        order = sorted(BLOCK_SIZES, key=lambda b: (abs(b - current), b))
        if ctx.agent_index % 2:
            order = order[::-1]
        picks = [b for b in order if b not in tried and b != current][: ctx.n]
        return [Candidate("engine.block_size", (), "knob", self.name, {"block_size": b}, None, f"block_size={b}")
                for b in picks]
