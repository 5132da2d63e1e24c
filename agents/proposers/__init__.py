"""Proposers: each turns the current state of a gap into candidates (built-in search; LLM)."""
from dataclasses import dataclass, field


@dataclass
class ProposalContext:
    op: str                      # "split12_gemv" | "engine.block_size"
    shape: tuple                 # (N, K) for GEMV
    device: str                  # cpu | cuda: which kind of candidate can run
    round: int
    agent_index: int
    n: int                       # how many candidates this agent should propose
    seed: int
    incumbent: object = None     # Candidate: the best known for this gap
    incumbent_time_s: float | None = None
    ceiling_s: float | None = None
    history: list = field(default_factory=list)  # [(Candidate, passed, time_s | None, reason)]
