"""T > 0 end to end for the new kinds: the first new tokens under speculative sampling are distributed
as under the target's own sampling (two-sample chi-square over the 3-token continuations, ours
spec vs ours AR, 800 runs each). The pairs accept drafts often (drafter_helpers.accepting_pair), so
the continuations mix accepted drafts, residual samples and bonus tokens."""
import collections

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from drafter_helpers import PROBE, accepting_pair

RUNS, TEMPERATURE = 800, 1.5


def _contingency_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    from scipy.stats import chi2_contingency

    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rare = (sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))
    table = [[a[k] for k in keys], [b[k] for k in keys]]
    if min(rare) > 0 or max(rare) >= 10:
        table[0].append(rare[0])
        table[1].append(rare[1])
    return chi2_contingency(table).pvalue


@pytest.mark.parametrize("kind", ["dflash2", "dspark", "pard"])
def test_spec_sampling_matches_ar_sampling(tmp_path_factory, kind):
    pair = accepting_pair(lambda: tmp_path_factory.mktemp(kind), kind)
    engine, seed = pair.engine, pair.seed
    spec, ar, accepted = collections.Counter(), collections.Counter(), 0
    for i in range(RUNS):
        r = engine.generate_spec(PROBE, 3, temperature=TEMPERATURE, seed=seed + i)
        spec[tuple(r.tokens)] += 1
        accepted += max(r.acceptance_lengths, default=0) > 1
        ar[tuple(engine.generate_ar(PROBE, 3, temperature=TEMPERATURE, seed=seed + RUNS + i).tokens)] += 1
    assert accepted > RUNS // 20, f"only {accepted} runs accepted a draft: the test would see little"
    assert len(spec) > 2, "a single continuation: nothing to compare"
    assert _contingency_pvalue(spec, ar) > 1e-4, f"seed {seed}: {spec.most_common(6)} vs {ar.most_common(6)}"
