"""Adaptive verify inside the batched engine (fp32, CPU): the step's verify length is chosen without a
read-back between the draft and the verify forward, it trims from the first steps, and whatever the
estimate says (right or planted wrong) only the rows verified change, never a token."""
import pytest
from torch.overrides import TorchFunctionMode

from batch_helpers import five_requests, EAGER_ADAPTIVE, accepting_pair, run_staggered, single
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.batch import BatchConfig, BatchEngine, forward, step
from specpilot.engine.batch.adaptive import AcceptanceEstimator
from specpilot.engine.graphs import StaticShapeStep

VOCAB = 10
# Tensor methods that bring a value to the host (each a device sync on a GPU).
READS = {"item", "tolist", "cpu", "numpy", "__array__", "__bool__", "__int__", "__float__", "__index__"}


class ReadBacks(TorchFunctionMode):
    """Counts host read-backs of tensors, apart for the span from a step's draft to its verify forward
    (`window`, opened by draft_all and closed by the target forward's launch) and the rest (`after`)."""

    def __init__(self):
        super().__init__()
        self.open, self.window, self.after = False, [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS or (name == "to" and _device_to_host(args, kwargs or {})):
            (self.window if self.open else self.after).append(name)
        return func(*args, **(kwargs or {}))


def _device_to_host(args, kwargs) -> bool:
    """A .to() from an accelerator to the host (on the CPU every upload is a .to("cpu"): not counted)."""
    source = args[0] if args and hasattr(args[0], "device") else None
    targets = list(args[1:]) + list(kwargs.values())
    return source is not None and source.device.type != "cpu" and any(str(t) == "cpu" for t in targets)


def traced(engine, monkeypatch, planted_read: bool = False) -> ReadBacks:
    """A ReadBacks whose window opens when `engine` drafts and closes at its target forward (graphed or
    eager). planted_read: the draft reads its blocks back (the old margin read-back's place), the
    control that shows the window sees reads."""
    reads = ReadBacks()
    draft_all, target_forward = step.draft_all, forward.target_forward

    def drafting(*args):
        reads.open = True
        drafts = draft_all(*args)
        if planted_read and drafts:
            next(iter(drafts.values())).blocks.cpu()
        return drafts

    def verifying(*args, **kwargs):
        reads.open = False
        return target_forward(*args, **kwargs)
    monkeypatch.setattr(step, "draft_all", drafting)
    monkeypatch.setattr(forward, "target_forward", verifying)
    if engine.graphs is not None:
        graphed_target = engine.graphs.target

        def graphed(*args):
            reads.open = False
            return graphed_target(*args)
        engine.graphs.target = graphed
    return reads


@pytest.fixture(scope="module")
def pair():
    return accepting_pair(VOCAB, 4, fresh_seed(), lambda s: requests_for(s))


def requests_for(seed, temperature=0.0):
    return five_requests(VOCAB, seed, temperature)


def engine_for(target, drafter, config, graphed: bool, max_batch: int = 3) -> BatchEngine:
    return BatchEngine(target, drafter, config, max_batch=max_batch, kv_pages=64,
                       graph_step_factory=StaticShapeStep if graphed else None)


@pytest.mark.parametrize("graphed", [False, True])
def test_no_read_back_between_draft_and_verify(pair, monkeypatch, graphed):
    """Greedy and sampled requests, adaptive verify trimming: nothing is read to the host between a
    step's draft and its verify forward; the step's read-back (the verify's argmax and ids) comes after."""
    target, drafter, seed = pair
    requests = requests_for(seed)[:3] + requests_for(seed, temperature=1.0)[3:]
    engine = engine_for(target, drafter, EAGER_ADAPTIVE, graphed)
    with traced(engine, monkeypatch) as reads:
        results = run_staggered(engine, requests, every=1)
    assert reads.window == [], f"seed {seed}: read-backs between draft and verify: {reads.window}"
    assert engine.verify_rows < engine.block_rows, f"seed {seed}: adaptive verify never trimmed"
    assert "tolist" in reads.after, "the tracer missed the step's own read-back: it would miss any"
    for i, req in enumerate(requests[:3]):
        assert results[i].tokens == single(target, drafter, req).tokens, f"seed {seed}, request {i}"


def test_the_tracer_sees_a_read_back_in_the_window(pair, monkeypatch):
    target, drafter, seed = pair
    engine = engine_for(target, drafter, EAGER_ADAPTIVE, graphed=False)
    with traced(engine, monkeypatch, planted_read=True) as reads:
        run_staggered(engine, requests_for(seed)[:2], every=1)
    assert "cpu" in reads.window


def test_trims_from_the_first_decode_steps(pair):
    """No warm-up: the optimistic prior verifies whole blocks at first, the labels of a pair that
    rarely accepts a draft trim the next steps."""
    target, drafter, seed = pair
    engine = engine_for(target, drafter, EAGER_ADAPTIVE, graphed=False, max_batch=5)
    rows = []
    choose = engine._verify_lengths
    engine._verify_lengths = lambda decoding, drafts, chunks: rows.append(choose(decoding, drafts, chunks)) or rows[-1]
    run_staggered(engine, requests_for(seed), every=1)
    decode_steps = [max(lengths.values()) for lengths in rows if lengths]
    first = next((i for i, t in enumerate(decode_steps) if t < engine.block_size), None)
    assert first is not None and first <= 3, f"seed {seed}: verify rows per decode step {decode_steps}"


def planted(engine, rate: float) -> AcceptanceEstimator:
    """An estimate that labels never move (prior strength 1e12) at conditional rate `rate`."""
    engine.estimator = AcceptanceEstimator(engine.estimator.positions, prior_mean=rate, prior_strength=1e12)
    return engine.estimator


@pytest.mark.parametrize("graphed", [False, True])
def test_a_wrong_estimate_costs_rows_never_tokens(pair, graphed):
    """A planted pessimistic estimate (every draft rejected) verifies the fewest rows every step, an
    optimistic one whole blocks; greedy tokens equal the single-request engine's either way, and with
    whole blocks the acceptance lengths too."""
    target, drafter, seed = pair
    requests = requests_for(seed)
    refs = [single(target, drafter, r) for r in requests]
    for rate, ridge in ((1e-6, 6), (1.0, 256)):      # each with a cost table under which its estimate matters
        config = BatchConfig(adaptive_verify=True, adaptive_probe_every=0, cost_ridge_tokens=ridge)
        engine = engine_for(target, drafter, config, graphed)
        planted(engine, rate)
        results = run_staggered(engine, requests)
        if rate < 0.5:
            assert engine.verify_rows < engine.block_rows, f"seed {seed}: the pessimistic estimate never trimmed"
        else:
            assert engine.verify_rows == engine.block_rows
        for i, ref in enumerate(refs):
            assert results[i].tokens == ref.tokens, f"seed {seed}, rate {rate}, request {i}"
            if rate == 1.0:
                assert results[i].acceptance_lengths == ref.acceptance_lengths, f"seed {seed}, request {i}"


def test_sampled_draws_unchanged_by_adaptive_while_it_verifies_whole_blocks(pair):
    """Temperature > 0: adaptive verify on but choosing whole blocks (an optimistic estimate) draws
    exactly what it draws off (the same uniforms from each request's generator), token for token. A
    trimmed verify draws other uniforms; its output law is tested in test_batch_sampling.py."""
    target, drafter, seed = pair
    for offset in range(8):             # request seeds until a draft is accepted (else nothing is compared)
        requests = requests_for(seed + offset, temperature=1.0)
        off = run_staggered(engine_for(target, drafter, BatchConfig(adaptive_verify=False), True), requests)
        engine = engine_for(target, drafter, BatchConfig(adaptive_verify=True), True)
        planted(engine, 1.0)
        on = run_staggered(engine, requests)
        assert engine.verify_rows == engine.block_rows
        for i in off:
            assert on[i].tokens == off[i].tokens and on[i].acceptance_lengths == off[i].acceptance_lengths, i
        if any(a > 1 for r in on.values() for a in r.acceptance_lengths):
            return
    raise AssertionError(f"seed {seed}: no draft accepted over 8 request seeds")
