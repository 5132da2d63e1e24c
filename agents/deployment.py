"""A deployment: what a mechanism's measured gain is valid for. (target shape, drafter kind, card,
concurrency, weight format); the memory keys its mechanism evaluations by `key`, and a new deployment
starts from the nearest one that has validated winners (`distance`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

WEIGHTS = ("bf16", "split12")


@dataclass(frozen=True)
class Deployment:
    target: str           # the target's shape name (config.json folder name or a shape preset)
    drafter: str          # the drafter's kind ("dflash-b16", "none")
    card: str             # "H100", "H200", "cpu"
    concurrency: int
    weights: str          # the format the deployment stores: split12 (decodes to bf16 too) or bf16

    def __post_init__(self):
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"Deployment.concurrency must be an int >= 1, got {self.concurrency!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"Deployment.weights must be one of {WEIGHTS}, got {self.weights!r}")
        for name in ("target", "drafter", "card"):
            value = getattr(self, name)
            if not value or "|" in value:
                raise ValueError(f"Deployment.{name} must be a non-empty name without '|', got {value!r}")

    @property
    def key(self) -> str:
        return f"{self.card}|{self.target}|{self.drafter}|C{self.concurrency}|{self.weights}"

    @staticmethod
    def from_key(key: str) -> "Deployment":
        parts = key.split("|")
        if len(parts) != 5 or not parts[3].startswith("C"):
            raise ValueError(f"deployment key {key!r} is not card|target|drafter|C<concurrency>|weights")
        card, target, drafter, conc, weights = parts
        return Deployment(target, drafter, card, int(conc[1:]), weights)

    def info(self) -> dict:
        return asdict(self)

    def supports(self, scope: str) -> bool:
        """Whether a mechanism of this scope (agents/mechanisms.py SCOPES) can act here."""
        return {"all": True, "cuda": self.card != "cpu", "drafter": self.drafter != "none",
                "batched": self.concurrency > 1, "split12": self.weights == "split12"}[scope]


def distance(a: Deployment, b: Deployment) -> float:
    """How far apart two deployments are for transfer: a different card or drafter matters most (the
    kernels and the acceptance change), then the target shape, then the concurrency regime (by
    factors of two), then the weight format."""
    import math

    d = 4.0 * (a.card != b.card) + 4.0 * (a.drafter != b.drafter) + 2.0 * (a.target != b.target)
    d += abs(math.log2(a.concurrency) - math.log2(b.concurrency)) + 1.0 * (a.weights != b.weights)
    return d
