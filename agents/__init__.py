"""The autonomous optimization loop: cost-model gaps, proposers, gates, memory."""
