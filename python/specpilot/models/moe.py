"""Qwen3-Next's sparse MoE MLP in plain torch (unoptimised): a softmax router picks the top-k experts
per token (weights renormalised when norm_topk_prob), each a SwiGLU MLP, plus a shared SwiGLU expert
scaled by sigmoid(shared_expert_gate(x)). Arithmetic as transformers' Qwen3NextSparseMoeBlock (eager
experts): router softmax in fp32, each expert's output weighted in the model dtype and summed with
index_add in expert order."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import SwiGLU


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, cfg):
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        e, inter = cfg.num_experts, cfg.moe_intermediate_size
        self.router = nn.Linear(hidden, e, bias=False)
        self.gate_up = nn.Parameter(torch.zeros(e, 2 * inter, hidden))      # per expert [gate; up] rows
        self.down = nn.Parameter(torch.zeros(e, hidden, inter))
        shared = cfg.shared_expert_intermediate_size
        self.shared = SwiGLU(hidden, shared) if shared else None
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if shared else None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = F.linear(x, self.router.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)                # [N, k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(logits.dtype)
        out = torch.zeros_like(x)
        for e in torch.unique(experts).tolist():
            rows, slot = torch.where(experts == e)
            gate, up = F.linear(x[rows], self.gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down[e]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return out.reshape(shape)
