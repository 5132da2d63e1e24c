"""LLM proposer: asks any OpenAI-compatible endpoint to edit the split12 GEMV kernel source.

Caps: max_tokens per call, a token budget for the whole run (usage from each response) and,
given a price per million tokens, a USD budget; the
client retries transport errors (max_retries), and an unparsable or contract-breaking reply is
re-asked with the error (max_attempts). What it returns is only a proposal: the gate decides.
"""
import hashlib
import json
import re

from specpilot.agents.candidates import ENTRY_POINTS, Candidate, gemv_geometry
from specpilot.agents.proposers import ProposalContext
from specpilot.kernels.variants.split12_gemv_cuda import render

CONTRACT = """You optimise one CUDA kernel: a split12 GEMV y = W x (M = 1) on an NVIDIA GPU.
Launch contract (keep it exactly; bf16 values are raw uint16 bits, no CUDA headers):
extern "C" __global__ void split12_gemv(const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
  const int* esc_rowptr, const int* esc_col, const unsigned short* esc_val,
  const unsigned short* x, unsigned short* y, int N, int K, int kpad)
Format: W is [N, K]; lo[n*kpad + k] is each weight's low byte; codes[n*kpad/2 + g*4 + (j%4)] holds
4-bit codes (sign<<3 | cls) for column k = 8g + j, low nibble if j < 4; hi byte = sign<<7 | (cls + base[n]);
bf16 bits = hi<<8 | lo. Escaped weights (CSR esc_rowptr/esc_col/esc_val) replace the decoded value.
Columns K..kpad-1 are padding and must not be added. y[n] = bf16 round-to-nearest-even of an fp32 sum.
Rules: the kernel must be correct for every N, K (it is tested on shapes it has never seen), decode
bit-exactly, accumulate in fp32, write every y[n], use only the launch stream, keep no state between
calls. The grid is ceil(N / rows_per_block) blocks of threads_per_row * rows_per_block threads.
Reply with one JSON object only: {"rationale": str, "threads_per_row": int, "rows_per_block": int,
"source": str (the complete .cu source)}."""

PYTHON_OPTION = """On this device you may instead reply with torch code: {"rationale": str, "language": "python",
"source": str} where the source defines def split12_gemv(lo, codes, base, esc_rowptr, esc_col,
esc_val, x, y, N, K, kpad) writing y in place, under the same rules."""
_CUDA_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(__launch_bounds__\([^)]*\)\s*)?split12_gemv\s*\(')


def parse_reply(text: str, op: str, shape, proposer: str) -> Candidate:
    """An LLM reply -> a Candidate (kind "cuda" or "python"); ValueError says what is unusable."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", body, re.S)
    if fenced:
        body = fenced.group(1)
    try:
        reply = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(reply, dict):
        raise ValueError("the JSON must be an object")
    source, language = reply.get("source"), reply.get("language", "cuda")
    if not isinstance(source, str):
        raise ValueError('"source" must be a string')
    params = {"rationale": str(reply.get("rationale", ""))[:500]}
    if language == "python":
        entry = ENTRY_POINTS.get(op)
        if entry is None or not re.search(rf"^def\s+{entry}\s*\(", source, re.M):
            raise ValueError(f'"source" must define def {entry or op}(...) at top level')
        return Candidate(op, tuple(shape), "python", proposer, params, source, f"llm-py-{_digest(source)}")
    if language != "cuda":
        raise ValueError(f'"language" must be "cuda" or "python", got {language!r}')
    if op != "split12_gemv" or not _CUDA_ENTRY.search(source):
        raise ValueError('"source" must define extern "C" __global__ void split12_gemv(...)')
    try:
        geometry = {"threads_per_row": int(reply["threads_per_row"]), "rows_per_block": int(reply["rows_per_block"])}
        gemv_geometry(geometry).validate()
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad launch geometry: {e}") from None
    params.update(geometry)
    label = f"llm-tpr{geometry['threads_per_row']}-rpb{geometry['rows_per_block']}-{_digest(source)}"
    return Candidate(op, tuple(shape), "cuda", proposer, params, source, label)


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:6]


class LLMUnavailable(RuntimeError):
    """The LLM cannot be used in this run (no client package, endpoint unreachable, auth)."""


class LLMProposer:
    def __init__(self, base_url: str, model: str, api_key: str = "", max_tokens: int = 4096,
                 token_budget: int = 200_000, max_attempts: int = 3, max_retries: int = 2, timeout_s: float = 180,
                 usd_per_mtok: float | None = None, usd_budget: float | None = None,
                 token_param: str = "max_tokens"):
        """token_param: "max_tokens", or "max_completion_tokens" for models that reject max_tokens
        (switched to automatically on that specific error)."""
        if not base_url or not model:
            raise ValueError(f"LLM proposer needs a base URL and a model (got base_url={base_url!r}, model={model!r})")
        try:
            from openai import OpenAI
        except ImportError:
            raise LLMUnavailable("the `openai` package is not installed (pip install openai)") from None
        self.client = OpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=max_retries, timeout=timeout_s)
        self.model, self.max_tokens, self.token_budget, self.max_attempts = model, max_tokens, token_budget, max_attempts
        self.usd_per_mtok, self.usd_budget = usd_per_mtok, usd_budget
        if token_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(f"token_param must be max_tokens or max_completion_tokens, got {token_param!r}")
        self.token_param = token_param
        self.tokens_used = 0
        self.calls = 0
        self.name = f"llm:{model}"

    @property
    def usd_spent(self) -> float | None:
        return None if self.usd_per_mtok is None else self.tokens_used * self.usd_per_mtok / 1e6

    @property
    def exhausted(self) -> bool:
        over_usd = self.usd_budget is not None and (self.usd_spent or 0.0) >= self.usd_budget
        return self.tokens_used >= self.token_budget or over_usd

    def propose(self, ctx: ProposalContext) -> list:
        if ctx.op != "split12_gemv":
            return []
        out = []
        for _ in range(ctx.n):
            cand = self._one(ctx)
            if cand is None:
                break
            out.append(cand)
        return out

    def _messages(self, ctx: ProposalContext) -> list:
        inc = ctx.incumbent
        source = inc.source if inc is not None and inc.source else render(gemv_geometry(inc.params if inc else {}))
        lines = [f"Shape N={ctx.shape[0]}, K={ctx.shape[1]}. Roofline (bytes / bandwidth): "
                 f"{(ctx.ceiling_s or 0) * 1e6:.1f} us. Current best: {(ctx.incumbent_time_s or 0) * 1e6:.1f} us "
                 f"({inc.label if inc else 'naive'}).", "Recent results:"]
        for c, ok, t, reason in ctx.history[-8:]:
            lines.append(f"- {c.label}: " + (f"{t * 1e6:.1f} us" if ok and t else f"rejected ({reason})"))
        lines += ["Current best source:", "```cuda", source, "```", "Propose one faster variant."]
        system = CONTRACT + ("\n" + PYTHON_OPTION if ctx.device == "cpu" else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]

    def _create(self, messages):
        """One completion; a model that rejects max_tokens is asked again with max_completion_tokens.
        Connection and authentication failures become LLMUnavailable (the loop falls back)."""
        import openai

        try:
            return self.client.chat.completions.create(model=self.model, messages=messages, temperature=0.7,
                                                       **{self.token_param: self.max_tokens})
        except openai.BadRequestError as e:
            if self.token_param == "max_tokens" and "max_completion_tokens" in str(e):
                self.token_param = "max_completion_tokens"
                return self._create(messages)
            raise
        except (openai.APIConnectionError, openai.AuthenticationError, openai.NotFoundError) as e:
            raise LLMUnavailable(f"{type(e).__name__}: {e}") from None

    def _one(self, ctx: ProposalContext):
        messages = self._messages(ctx)
        for _ in range(self.max_attempts):
            if self.exhausted:
                return None
            resp = self._create(messages)
            self.calls += 1
            usage = getattr(resp, "usage", None)
            self.tokens_used += int(getattr(usage, "total_tokens", 0) or 0) if usage else self.max_tokens
            text = resp.choices[0].message.content or ""
            try:
                return self._parse(text, ctx)
            except ValueError as e:  # re-ask with the problem stated
                messages = messages + [{"role": "assistant", "content": text},
                                       {"role": "user", "content": f"That reply was not usable: {e}. "
                                                                   "Reply with the JSON object only."}]
        return None

    def _parse(self, text: str, ctx: ProposalContext) -> Candidate:
        return parse_reply(text, ctx.op, ctx.shape, self.name)
