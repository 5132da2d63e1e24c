"""`specpilot <command> ...`: each command is a module in specpilot.commands with
`configure(parser)` and `run(args) -> int`; only the chosen one is imported."""
import argparse
import importlib
import os
import sys
import warnings

COMMANDS = {
    "demo": "speculative decoding of a few prompts with the zoo pair, or the small pair shipped with specpilot",
    "env": "versions, build flags, GPU, which implementation of each op is live",
    "generate": "generate text with AR or speculative decoding",
    "serve": "an OpenAI-compatible HTTP server on the batched speculative engine",
    "verify": "run stock DFlash and ours, token-force, exit 0 only if every prompt passes",
    "bench": "the five benchmarks: tokens/s, tau, speedups; JSONL, markdown and a plot",
    "pack": "convert a bf16 HF checkpoint folder to split12",
    "unpack": "convert a split12 folder back to bf16 safetensors (bit-exact)",
    "stats": "per-tensor exponent coverage, escapes and bits/weight of a checkpoint",
    "cost": "per-component time against its ceiling, ranked by time lost per token",
    "draft-vocab": "rank the target's tokens by frequency for a reduced draft head (--draft-vocab N)",
    "optimize": "the agent loop: search kernel variants and engine knobs, gate, integrate",
    "memory": "show the agents' structured memory",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items())
    return f"usage: specpilot <command> [options]\n\ncommands:\n{rows}\n\n`specpilot <command> -h` for its options."


def quiet_progress_bars_when_piped() -> None:
    """Hugging Face's download / "Loading weights" bars are for a terminal: piped output stays plain."""
    if sys.stderr.isatty():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")     # read when huggingface_hub is imported
    if "transformers" in sys.modules:                               # already imported: switch it off now
        sys.modules["transformers"].utils.logging.disable_progress_bar()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`-h` shows each option's default, except where there is none to show (None, a False flag)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def plain_specpilot_warnings() -> None:
    """Our own warnings (e.g. a slow path) as one line, `specpilot: warning: ...`; others as Python shows them."""
    python_format = warnings.formatwarning
    if getattr(python_format, "specpilot", False):
        return

    def format_warning(message, category, filename, lineno, line=None):
        if category.__module__.startswith("specpilot"):
            return f"specpilot: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    format_warning.specpilot = True
    warnings.formatwarning = format_warning


def _device_failure(error: Exception) -> bool:
    """A CUDA (accelerator) error, or an error that wraps one to say where (torch raises it as a
    RuntimeError)."""
    torch = sys.modules.get("torch")
    kind = getattr(torch, "AcceleratorError", ()) if torch is not None else ()
    return isinstance(error, kind) or isinstance(error.__cause__, kind)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_progress_bars_when_piped()
    plain_specpilot_warnings()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"specpilot: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"specpilot.commands.{name.replace('-', '_')}")
    parser = argparse.ArgumentParser(prog=f"specpilot {name}", description=COMMANDS[name],
                                     formatter_class=HelpFormatter)
    module.configure(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        if _device_failure(e):
            raise              # the engine's failure, not bad input: its traceback is what finds it
        # Bad input: one clear line naming the problem, no traceback.
        print(f"specpilot {name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:                  # Ctrl-C outside a command's own handling: no traceback
        print(f"\nspecpilot {name}: interrupted", file=sys.stderr)
        return 130
