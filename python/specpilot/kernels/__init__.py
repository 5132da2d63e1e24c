"""Kernel implementations: which one is live per op, and JIT-compiled variants from the agents."""
