"""The configurations an engine A/B compares, parsed from the command line.

A configuration is `default` or `field=value[+field=value...]`: fields of EngineConfig (values parsed by
the field's type), plus one bench dimension, `weights=bf16|split12` (the weight format of the target
and drafter: a property of the loaded models, not of the engine). Unknown fields and values that do not
parse are refused with a message naming the field and what it accepts.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

WEIGHT_FORMATS = ("bf16", "split12")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True)
class AbConfig:
    name: str                    # as given on the command line
    overrides: dict              # EngineConfig field -> parsed value
    weights: str = "bf16"

    def engine_config(self, config_cls):
        return dataclasses.replace(config_cls(), **self.overrides)


def _field_types(config_cls) -> dict:
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(config_cls)}


def _parse_value(field: str, text: str, kind):
    """`text` as a value of type `kind` (bool, int, float, str, Literal, Optional, Path-like)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:                                  # Optional[X] and X | None
        if text.lower() == "none" and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _parse_value(field, text, inner[0])
        raise ValueError(f"{field}: cannot parse a value of type {kind}")
    if origin is typing.Literal:
        for allowed in args:
            if str(allowed) == text:
                return allowed
        raise ValueError(f"{field}={text!r}: choose one of {', '.join(map(str, args))}")
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{field}={text!r}: a bool (true/false, on/off, 1/0)")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{field}={text!r}: an {kind.__name__} is needed") from None
    if kind is str or (isinstance(kind, type) and issubclass(kind, str)):
        return text
    if callable(kind):                                          # e.g. pathlib.Path
        return kind(text)
    raise ValueError(f"{field}: cannot parse a value of type {kind}")


def parse_config(text: str, config_cls) -> AbConfig:
    """One configuration: 'default' or 'field=value+field=value'."""
    text = text.strip()
    if not text:
        raise ValueError("an empty configuration: use 'default' or field=value[+field=value]")
    if text == "default":
        return AbConfig("default", {})
    types = _field_types(config_cls)
    overrides, weights = {}, "bf16"
    for part in text.split("+"):
        field, eq, value = part.partition("=")
        field, value = field.strip(), value.strip()
        if not eq or not field or not value:
            raise ValueError(f"{part!r} in {text!r}: expected field=value")
        if field == "weights":
            if value not in WEIGHT_FORMATS:
                raise ValueError(f"weights={value!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
            weights = value
            continue
        if field not in types:
            raise ValueError(f"{field!r} is not an EngineConfig field; the fields are: weights, "
                             f"{', '.join(sorted(types))}")
        if field in overrides:
            raise ValueError(f"{field!r} is set twice in {text!r}")
        overrides[field] = _parse_value(field, value, types[field])
    config = AbConfig(text, overrides, weights)
    config.engine_config(config_cls)                            # the dataclass's own checks, now
    return config


def parse_configs(text: str, config_cls) -> list[AbConfig]:
    """Comma-separated configurations, at least one, no name twice."""
    configs = [parse_config(part, config_cls) for part in text.split(",")]
    names = [c.name for c in configs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"configuration(s) given twice: {', '.join(repeated)} (use --reps to repeat)")
    return configs
