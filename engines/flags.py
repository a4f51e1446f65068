"""Command-line flags derived from settings dataclasses, so that each setting is written once, on its field.

As vLLM's ``EngineArgs`` (``vllm/engine/arg_utils.py``) does: a field's flag is ``--field-name``, its default is
the field's, its help is the first paragraph of the field's attribute docstring, its type comes from the
annotation and its choices from a ``Literal[...]`` annotation. Where a flag is spelled otherwise (another name,
a ``--no-...`` flag that turns a field off, choices kept in a tuple, a converter from the flag's text), the field
says so in its metadata (:func:`flag`), never a special case here; a field that no flag sets is marked
:data:`NO_FLAG`.

The help ends with ``(default: X)`` unless the docstring's first paragraph has its own ``(default ...)`` (where
the default means more than a value, e.g. "vLLM's 0.9") or the default is ``None`` or a boolean. Values are checked
once, in the settings' ``__post_init__``, not here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, Union

METADATA_KEY = "flag"
"""The key of a field's metadata that holds its :class:`Flag`."""


@dataclass(frozen=True)
class Flag:
    """How a field's flag differs from the one its name, annotation, default and docstring give."""

    name: str | None = None
    """The flag without its dashes (``hf-readout-path``); None: the field's name with ``-`` for ``_``. The
    namespace attribute (``dest``) is this name with ``_`` for ``-``, as argparse makes it."""
    choices: Sequence[str] | None = None
    """The allowed values, where the annotation is a plain ``str``."""
    negate: bool = False
    """A boolean field that is True by default, set False by a ``store_true`` flag (``--no-prefix-caching``)."""
    help: str | None = None
    """Only for a negated flag, whose help says what the flag does (the docstring says what the field does)."""
    convert: Callable[[Any], Any] | None = None
    """From the parsed value (argparse's, unchanged in the namespace) to the field's (a JSON object's text to a
    dict); it also receives the flag's default when the flag is not given."""
    none: bool = False
    """No flag sets this field (it comes from the model spec or from code)."""


def flag(**kw: Any) -> dict[str, Flag]:
    """Field metadata: ``field(default=..., metadata=flag(name="hf-readout-path", choices=PATHS))``."""
    return {METADATA_KEY: Flag(**kw)}


NO_FLAG: Mapping[str, Flag] = {METADATA_KEY: Flag(none=True)}
"""Field metadata of a setting no flag sets."""

S = TypeVar("S")


# ------------------------------------------------------------------- reading the class
@cache
def attr_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a class and its bases (a string literal right after an annotated field),
    cleaned as ``inspect.cleandoc`` does; a subclass's docstring for a field wins over its base's."""
    docs: dict[str, str] = {}
    for c in reversed(cls.__mro__):
        if c is not object and dataclasses.is_dataclass(c):
            docs.update(_own_attr_docs(c))
    return docs


@cache
def _own_attr_docs(c: type) -> dict[str, str]:
    """The attribute docstrings ``c`` itself declares (its source parsed once, however many subclasses ask)."""
    try:
        source = textwrap.dedent(inspect.getsource(c))
    except (OSError, TypeError):  # pragma: no cover - a class built at run time has no source
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


@cache
def _hints(cls: type) -> dict[str, Any]:
    """The class's resolved annotations (resolving compiles each string annotation: once per class, not per flag)."""
    return typing.get_type_hints(cls)


def flag_of(f: dataclasses.Field[Any]) -> Flag:
    """The field's :class:`Flag` (the plain one where its metadata names none)."""
    return f.metadata.get(METADATA_KEY, Flag())  # type: ignore[no-any-return]


def flag_name(f: dataclasses.Field[Any]) -> str:
    return flag_of(f).name or f.name.replace("_", "-")


def dest(f: dataclasses.Field[Any]) -> str:
    """The namespace attribute the field's flag writes (argparse's ``dest``)."""
    return flag_name(f).replace("-", "_")


def flagged(cls: type, names: Iterable[str] | None = None, *, own: bool = False) -> list[dataclasses.Field[Any]]:
    """The fields of dataclass ``cls`` that a flag sets, in declaration order: those named (in that order), or
    all of them, or (``own``) those ``cls`` declares itself, not its bases."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if names is not None:
        chosen = [by_name[n] for n in names]
    elif own:
        chosen = [by_name[n] for n in inspect.get_annotations(cls) if n in by_name]
    else:
        chosen = list(by_name.values())
    return [f for f in chosen if not flag_of(f).none]


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return None  # a default factory (a mutable value): the flag's default is None, and ``convert`` makes the value


def _unwrap(tp: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """(the type without ``None``, the ``Literal`` values if it is one)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [t for t in typing.get_args(tp) if t is not type(None)]
        tp = args[0] if len(args) == 1 else str
    if typing.get_origin(tp) is typing.Literal:
        return str, typing.get_args(tp)
    return tp, None


def help_of(cls: type, f: dataclasses.Field[Any], default: Any) -> str:
    """The help of the field's flag: the first paragraph of its docstring without reST markup, a sentence's first
    capital or its final stop, then ``(default: X)`` unless the text has its own ``(default ...)`` or there is none
    to show. A field named in double backquotes is shown as its flag (``think_budget``: ``--think-budget``)."""
    fl = flag_of(f)
    if fl.help is not None:
        return fl.help
    doc = attr_docs(cls).get(f.name)
    if not doc:
        raise ValueError(f"{cls.__name__}.{f.name} has a flag but no docstring to take its help from")
    flags = {g.name: f"--{flag_name(g)}" for g in flagged(cls) if not flag_of(g).negate}
    text = " ".join(doc.split("\n\n", 1)[0].split())
    text = re.sub(r"``(\w+)``", lambda m: flags.get(m.group(1), m.group(1)), text)  # a field named: its flag
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "").rstrip(".")
    if re.match(r"[A-Z][a-z]", text):  # a sentence's capital, not a name's (KV, GPUs, JSON): as argparse's own help
        text = text[0].lower() + text[1:]
    if not (default is None or isinstance(default, bool) or "(default" in text):
        text += f" (default: {default:g})" if isinstance(default, float) else f" (default: {default})"
    return text.replace("%", "%%")  # argparse formats the help with %


# -------------------------------------------------------------------------- both ways
def add_flags(
    g: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Iterable[str] | None = None,
    *,
    own: bool = False,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of ``cls`` that a flag sets (:func:`flagged` chooses them), on ``g``.

    ``defaults`` (field -> value) changes a flag's default where one command starts elsewhere (a judge's
    shorter replies); the field's own default is unchanged.
    """
    hints = _hints(cls)
    for f in flagged(cls, names, own=own):
        fl = flag_of(f)
        default = (defaults or {}).get(f.name, _field_default(f))
        kw: dict[str, Any] = {"dest": dest(f)}
        tp, literal = _unwrap(hints[f.name])
        if tp is bool:
            if fl.negate:
                if default is not True:
                    raise ValueError(f"{cls.__name__}.{f.name}: a negated flag turns off a field that is True")
                kw.update(action="store_true", help=help_of(cls, f, None))
            elif default:
                kw.update(action=argparse.BooleanOptionalAction, default=True, help=help_of(cls, f, None))
            else:
                kw.update(action="store_true", help=help_of(cls, f, None))
        else:
            kw["default"] = default
            if tp in (int, float):
                kw["type"] = tp
            choices = fl.choices if fl.choices is not None else literal
            if choices is not None:
                kw["choices"] = list(choices)
            kw["help"] = help_of(cls, f, default)
        g.add_argument(f"--{flag_name(f)}", **kw)


def settings_from_flags(cls: type[S], a: argparse.Namespace, **given: Any) -> S:
    """``cls`` from parsed flags: every field whose flag the namespace has (negated, converted as its metadata
    says), and the values ``given``.

    A flag the namespace lacks (one built without the CLI, or without this backend's flags) is not passed, so its
    field keeps the dataclass default (or default factory), written once, on the field.
    """
    values: dict[str, Any] = {}
    for f in flagged(cls):
        if f.name in given or not hasattr(a, dest(f)):
            continue
        fl, value = flag_of(f), getattr(a, dest(f))
        if fl.negate:
            value = not value
        if fl.convert is not None:
            value = fl.convert(value)
        values[f.name] = value
    return cls(**values, **given)
