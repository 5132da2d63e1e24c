"""Paged attention cases shared by the CPU and GPU tests: a pool whose pages are handed out to the
requests in shuffled order, and the plain per-request gathered SDPA the reference is checked against."""
import torch
import torch.nn.functional as F


def paged_case(gen, contexts, rows, hq, hkv, t, d, page_size, dtype, device="cpu", spare_pages=3, q_scale=2.0):
    """Requests r = 0..R-1 with contexts[r] keys (positions 0..contexts[r]-1) and rows[r] query rows
    (the rest of T are padding rows, last = -1). Returns (q, k_pool, v_pool, page_table, last): pages
    taken from a shuffled pool, unused table entries -1, and every slot no request owns holds NaN
    (must never be read). last[r] = the causal rows ending at contexts[r] - 1."""
    r_count = len(contexts)
    need = [-(-n // page_size) for n in contexts]
    pages = sum(need) + spare_pages
    order = torch.randperm(pages, generator=gen).tolist()
    width = max(max(need), 1)
    table = torch.full((r_count, width), -1, dtype=torch.int32)
    taken = 0
    for r, n in enumerate(need):
        table[r, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
    k_pool = torch.randn(1, hkv, pages * page_size, d, generator=gen, dtype=torch.float64)
    v_pool = torch.randn(1, hkv, pages * page_size, d, generator=gen, dtype=torch.float64)
    owned = torch.zeros(pages * page_size, dtype=torch.bool)
    for r, n in enumerate(contexts):
        owned[slots_of(table[r], n, page_size)] = True
    k_pool[:, :, ~owned] = float("nan")
    v_pool[:, :, ~owned] = float("nan")
    q = torch.randn(r_count, hq, t, d, generator=gen, dtype=torch.float64) * q_scale
    last = torch.full((r_count, t), -1, dtype=torch.int64)
    for r, (n, m) in enumerate(zip(contexts, rows)):
        last[r, :m] = torch.arange(n - m, n)
    to = lambda x: x.to(device=device, dtype=dtype)
    return to(q), to(k_pool), to(v_pool), table.to(device), last.to(device)


def slots_of(table_row, n, page_size):
    """Physical slots (int64) of logical keys 0..n-1 of one request."""
    j = torch.arange(n, device=table_row.device)
    return table_row[j // page_size].long() * page_size + j % page_size


def gathered_sdpa(q, k_pool, v_pool, page_table, page_size, last, scale):
    """Request by request: its keys gathered in logical order, then SDPA with a boolean mask over
    its rows that see a key; rows that see none stay zero. -> [R, T, Hq * D] in q's dtype."""
    r_count, hq, t, d = q.shape
    g = hq // k_pool.shape[1]
    span = page_table.shape[1] * page_size
    out = torch.zeros(r_count, t, hq, d, dtype=q.dtype, device=q.device)
    for r in range(r_count):
        lim = last[r].clamp(max=span - 1)
        n = int(lim.max()) + 1
        live = lim >= 0
        if n <= 0:
            continue
        slots = slots_of(page_table[r], n, page_size)
        k = k_pool[0][:, slots].repeat_interleave(g, dim=0)                 # [Hq, n, D]
        v = v_pool[0][:, slots].repeat_interleave(g, dim=0)
        mask = torch.arange(n, device=q.device)[None, :] <= lim[live][:, None]   # [rows, n]
        o = F.scaled_dot_product_attention(q[r][:, live], k, v, attn_mask=mask, scale=scale)   # [Hq, rows, D]
        out[r, live] = o.transpose(0, 1)
    return out.reshape(r_count, t, hq * d)
