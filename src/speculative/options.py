"""Command-line options read from settings dataclasses: how a field's default, type, help and metadata
become an argparse option, and how parsed arguments become the dataclass again (whose checks then run).

Explained in: the CLI's module docstring (:mod:`speculative.cli`). A field takes part when its metadata has
a ``help`` (:func:`speculative.defaults.setting`); ``flag``, ``metavar``, ``choices``, ``words`` (values
passed as they are), ``repeat`` (an option given several times) and ``parse`` (a named parser) refine it.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Callable, Sequence

from speculative.training.train import parse_shape

__all__ = ["Parser", "argument", "count", "settings_options", "settings_from"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def argument(convert: Callable, many: bool = False, words: Sequence[str] = ()) -> Callable:
    """An argparse type that converts text (comma-separated parts with ``many``; ``words`` pass as they are);
    a library ``ValueError`` becomes the one-line usage error."""

    def parse(text: str):
        parts = [part.strip() for part in text.split(",")] if many else [text]
        try:
            values = [part if part in words else convert(part) for part in parts if part]
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error) if convert not in (int, float) else
                                             f"expected {'comma-separated ' if many else ''}"
                                             f"{'integers' if convert is int else 'numbers'}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected a value, got {text!r}")
        return values if many else values[0]

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def _field_option(field: dataclasses.Field, hints: dict) -> tuple[tuple, dict]:
    """The option of a settings field: its flag, help, metavar and choices from the field's metadata, its type
    from its default (a tuple: comma-separated values of its items' type) or its annotation."""
    meta, default = field.metadata, field.default
    flags = (meta.get("flag", "--" + field.name.replace("_", "-")),)
    common = {"dest": field.name, "help": meta["help"]}
    if meta.get("repeat") or isinstance(default, bool):
        return flags, {**common, **({"action": "append", "metavar": meta.get("metavar")} if meta.get("repeat")
                                    else {"action": "store_true"})}
    if isinstance(default, tuple):
        kind = type(default[0]) if default else str
        kind = {"shape": parse_shape}.get(meta.get("parse"), kind)
        convert, default = argument(kind, many=True, words=meta.get("words", ())), list(default)
    else:
        kind = next((t for t in (int, float, str) if t in typing.get_args(hints[field.name])
                     or hints[field.name] is t), str)
        convert = argument(kind, words=meta.get("words", ()))
    extra = {"choices": meta["choices"]} if "choices" in meta else {"type": convert}
    return flags, {**common, "default": default, "metavar": meta.get("metavar"), **extra}


def settings_options(cls, only: Sequence[str] = ()) -> list:
    hints = typing.get_type_hints(cls)
    return [_field_option(f, hints) for f in dataclasses.fields(cls)
            if "help" in f.metadata and (not only or f.name in only)]


def settings_from(cls, args) -> object:
    """The settings dataclass filled from the parsed arguments (its own checks run here)."""
    return cls(**{f.name: tuple(getattr(args, f.name) or ()) if f.metadata.get("repeat") else getattr(args, f.name)
                  for f in dataclasses.fields(cls) if hasattr(args, f.name)})
