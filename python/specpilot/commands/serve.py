"""`specpilot serve`: an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics) on the batched speculative engine. Ctrl-C / SIGTERM finishes the
in-flight requests for up to --shutdown-timeout seconds, then cancels the rest, and says so."""
import logging
from pathlib import Path

from specpilot.engine.cli_support import checked_block_size, load_pair


def configure(parser):
    import torch

    parser.add_argument("--target", required=True, help="target model folder (HF format)")
    parser.add_argument("--drafter", required=True, help="DFlash drafter folder")
    parser.add_argument("--weights", default=None, choices=["bf16", "split12"],
                        help="the target's weights, which the drafter's follow (default: as stored)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=8, help="requests decoding at once (more wait in a queue)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients send (default: --target's folder name)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest prompt + completion of one request "
                             "(default: the target's positions, at most 4096)")
    parser.add_argument("--kv-pages", type=int, default=None,
                        help="KV cache pages of 16 tokens (default: --max-batch requests of --max-model-len)")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds in-flight requests get to finish at shutdown before they are cancelled")


def run(args) -> int:
    import torch

    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights
    from specpilot.serve.server import make_served, make_server

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in 1..65535")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch {args.max_batch} must be >= 1")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout {args.shutdown_timeout} must be >= 0")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, args.dtype, weights)
    block_size = checked_block_size(args.block_size, drafter)
    name = args.served_model_name or Path(args.target).resolve().name
    served = make_served(target, drafter, tok, name, stop_ids_for(target, tok), args.max_batch, args.max_model_len,
                         args.kv_pages, block_size)
    make_server(served, args.host, args.port, args.shutdown_timeout).run()
    return 0
