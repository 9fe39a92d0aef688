"""Which config fields point outside the config: a file, a folder, a model, code to run, a URL.

Each such field says so in its type (``train_file: FilePath``): the :class:`Reference` in its
annotation is the one record of what the value names. :func:`references` walks a validated config
and yields every reference it holds with its dotted path, so that whoever must police them (the job
service keeps every job inside its workspace, :mod:`rlft.service.workspace`) checks them all in one
loop, and a new field typed as a reference is checked without anyone remembering to. A test walks
the schema and fails on a string field that is neither a reference nor listed as plain text.

No I/O here: what a reference may point at is the caller's policy.
"""

from __future__ import annotations

import shlex
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel

ReferenceKind = Literal["file", "dir", "model", "run_name", "code", "url", "store", "command"]


@dataclass(frozen=True)
class Reference:
    """What a string field names.

    ``kind``: ``file`` (read), ``dir`` (written: an output folder), ``model`` (a model folder or
    .gguf file), ``run_name`` (a folder under ``train.output_dir``), ``code`` ('file.py:name' or
    'module:name', imported and run), ``url`` (an http(s) endpoint), ``store`` (a tracker URI: a
    server URL or a store on disk), ``command`` (a program and its arguments, started as a process; a
    list, yielded as one value). ``names``: values that name something built in, not a path."""

    kind: ReferenceKind
    names: tuple[str, ...] = ()


FilePath = Annotated[str, Reference("file")]
OutputDir = Annotated[str, Reference("dir")]
CodeRef = Annotated[str, Reference("code")]
UrlRef = Annotated[str, Reference("url")]
RunName = Annotated[str, Reference("run_name")]
StoreUri = Annotated[str, Reference("store")]
ModelDir = Annotated[str, Reference("model")]  # a model folder or .gguf file (built-in names: sections.ModelPath)


def reference_in(annotation: Any) -> Reference | None:
    """The Reference inside a field's annotation (through ``X | None``, ``list[X]`` and Annotated)."""
    if typing.get_origin(annotation) is Annotated:
        found = [m for m in annotation.__metadata__ if isinstance(m, Reference)]
        return found[0] if found else reference_in(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple):
        for arg in typing.get_args(annotation):
            ref = reference_in(arg)
            if ref is not None:
                return ref
    return None


def leaf_types(annotation: Any) -> list:
    """The types a field can hold, through ``X | None``, ``list[X]``, ``dict[K, V]`` and Annotated
    (what a walk over the schema looks at, for nested sections and for string fields)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        return [t for arg in typing.get_args(annotation) for t in leaf_types(arg)]
    return [annotation]


def field_reference(model: type[BaseModel], name: str) -> Reference | None:
    """The Reference of field ``name`` of ``model`` (pydantic keeps a bare Annotated's metadata apart)."""
    info = model.model_fields[name]
    found = [m for m in info.metadata if isinstance(m, Reference)]
    return found[0] if found else reference_in(info.annotation)


def references(section: BaseModel, prefix: str = "") -> Iterator[tuple[str, Reference, str]]:
    """(dotted path, reference, value) of every reference a validated config holds; list items are
    numbered (``reward.functions.0.function``), named sections by their names
    (``environment.classes.wordle.class``), and built-in names are left out. A section whose
    free-form values hold references (an environment's constructor arguments) yields them from its
    ``extra_references()``."""
    for name, info in type(section).model_fields.items():
        dotted = f"{prefix}{info.alias or name}"
        value = getattr(section, name)
        ref = field_reference(type(section), name)
        if ref is not None and ref.kind == "command" and isinstance(value, list):
            yield dotted, ref, shlex.join(value)  # one program, however many words
            continue
        items: list[tuple[int | str | None, Any]]
        if isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, dict) and any(isinstance(v, BaseModel) for v in value.values()):
            items = list(value.items())  # named sections (environment.classes.<name>)
        else:
            items = [(None, value)]
        for index, item in items:
            path = dotted if index is None else f"{dotted}.{index}"
            if isinstance(item, BaseModel):
                yield from references(item, path + ".")
            elif isinstance(item, str) and ref is not None and item not in ref.names:
                yield path, ref, item
    extra = getattr(section, "extra_references", None)
    if extra is not None:
        for rel, ref, value in extra():
            yield f"{prefix}{rel}", ref, value
