"""GenerationResult: what one generate_ar / generate_spec call returns (the engine API)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    prompt_len: int
    tokens: list                                   # new tokens only, stop token included
    acceptance_lengths: list = field(default_factory=list)  # tokens per verify step, bonus included (stock's)
    prefill_s: float = 0.0                         # prompt forward + first token
    decode_s: float = 0.0                          # everything after the first token
    steps: int = 0                                 # decode steps (AR tokens or verify passes)
    replay_shortfalls: int = 0                     # replay: steps whose drafts the target did not fully accept

    @property
    def tokens_per_s(self) -> float:
        """New tokens / decode seconds, as dflash's `1 / time_per_output_token`."""
        n = len(self.tokens)
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Mean acceptance length (dflash's 'Average Acceptance length'), 0 when there was no step."""
        a = self.acceptance_lengths
        return sum(a) / len(a) if a else 0.0
