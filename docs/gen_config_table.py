"""The README's configuration table, generated from EngineConfig so that it cannot drift:

    python docs/gen_config_table.py            # print the table
    python docs/gen_config_table.py --write    # replace it in README.md, between the markers
    python docs/gen_config_table.py --check    # exit 1 if README.md's table is not the generated one

One row per dataclass field: its name, type, default and what it chooses. The description is the
field's docstring (the string literal right after it in the class body), folded onto one line.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import textwrap
import typing
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"
BATCH_START, BATCH_END = "<!-- batch-config-table:start -->", "<!-- batch-config-table:end -->"   # BatchConfig's


def _field_docs(cls) -> dict:
    """field name -> its attribute docstring in the class body ('' where there is none)."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    except (OSError, TypeError):
        return {}
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(kind) -> str:
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace("typing.", "")


def _default(field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "(required)"


def config_table(cls) -> str:
    """Markdown table of `cls`'s dataclass fields."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints, docs = typing.get_type_hints(cls), _field_docs(cls)
    lines = ["| field | type | default | what it chooses |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        doc = docs.get(f.name, "")
        lines.append(f"| `{f.name}` | `{_type_name(hints.get(f.name, f.type))}` | `{_default(f)}` | "
                     f"{doc.replace('|', '/')} |")
    return "\n".join(lines)


def replace_table(text: str, table: str, start: str = START, end: str = END) -> str:
    """`text` with everything between the two markers replaced by `table`."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the README needs exactly one {start} ... {end} pair")
    head, rest = text.split(start)
    return head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="replace the table in README.md")
    p.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale")
    args = p.parse_args(argv)
    from specpilot.config import EngineConfig
    from specpilot.engine.batch import BatchConfig

    table, batch_table = config_table(EngineConfig), config_table(BatchConfig)
    if not (args.write or args.check):
        print(table + "\n\n" + batch_table)
        return 0
    text = README.read_text(encoding="utf-8")
    new = replace_table(replace_table(text, table), batch_table, BATCH_START, BATCH_END)
    if args.check:
        if new != text:
            print("README.md's configuration table is stale: python docs/gen_config_table.py --write", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote the configuration table into {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
