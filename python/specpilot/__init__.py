"""SpecPilot: lossless speculative decoding with parallel drafters."""

__version__ = "0.1.0"
