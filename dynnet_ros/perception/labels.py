"""Class names of a model: from its ONNX metadata or a labels file; and the `classes` selection.

Ultralytics writes ``names`` into the ONNX metadata as a Python dict literal
(``{0: 'person', 1: 'bicycle', ...}``); it is parsed with ``ast.literal_eval``, which accepts
literals only, so a model file can never run code here. Other exporters write a JSON list or
dict, which is also a Python literal.
"""
from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Sequence

import yaml

#: metadata keys read for class names, in order
NAME_KEYS = ("names", "labels", "classes")


def parse_names(text: str, where: str) -> list[str]:
    """A list/dict literal of class names -> names indexed by class id (gaps named by their id)."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"{where}: class names are not a list or dict literal ({type(exc).__name__})") from None
    return names_from_value(value, where)


def names_from_value(value: object, where: str) -> list[str]:
    if isinstance(value, dict):
        try:
            ids = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise ValueError(f"{where}: class-name keys must be integer ids") from None
        if not ids:
            return []
        if min(ids) < 0:
            raise ValueError(f"{where}: class ids must be >= 0")
        return [ids.get(i, str(i)) for i in range(max(ids) + 1)]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise ValueError(f"{where}: class names must be a list or a dict of id -> name, got {type(value).__name__}")


def names_from_metadata(metadata: dict[str, str]) -> list[str] | None:
    for key in NAME_KEYS:
        if key in metadata:
            return parse_names(metadata[key], f"model metadata '{key}'")
    return None


def read_labels_file(path: str | os.PathLike) -> list[str]:
    """One name per line (blank lines skipped), or a YAML/JSON file with a ``names`` list/dict
    (an Ultralytics dataset file) or a bare list/dict."""
    where = os.fspath(path)
    if not os.path.isfile(where):
        raise ValueError(f"labels_file not found: {where}")
    with open(where, encoding="utf-8") as handle:
        text = handle.read()
    if where.endswith((".yaml", ".yml", ".json")):
        try:
            data = yaml.safe_load(text)  # JSON is YAML
        except yaml.YAMLError as exc:
            raise ValueError(f"labels_file {where} is not valid YAML/JSON: {exc}") from None
        if isinstance(data, dict) and "names" in data:
            data = data["names"]
        names = names_from_value(data, f"labels_file {where}")
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise ValueError(f"labels_file {where} has no class names")
    return names


def resolve_classes(classes: Iterable[int | str], names: Sequence[str] | None, count: int | None,
                    what: str = "classes") -> frozenset[int]:
    """`classes` (ids or names) -> class ids; empty = no filter. ValueError for unknown entries."""
    if isinstance(classes, (str, bytes)):
        raise ValueError(f"{what} must be a list of class names or ids, got the string {classes!r}")
    ids: set[int] = set()
    known = count if count is not None else (len(names) if names else None)
    for item in classes:
        if isinstance(item, bool):
            raise ValueError(f"{what}: {item!r} is neither a class id nor a name")
        if isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit()):
            cid = int(item)
            if cid < 0 or (known is not None and cid >= known):
                raise ValueError(f"{what}: class id {cid} is out of range (the model has {known} classes)")
            ids.add(cid)
        elif isinstance(item, str):
            if not names or item not in names:
                listed = ", ".join(names[:20]) + (" ..." if names and len(names) > 20 else "") if names else ""
                raise ValueError(f"{what}: unknown class name {item!r}; "
                                 + (f"the model's names: {listed}" if names else
                                    "the model has no class names (give ids or a labels_file)"))
            ids.add(names.index(item))
        else:
            raise ValueError(f"{what}: {item!r} is neither a class id nor a name")
    return frozenset(ids)


def class_name(names: Sequence[str] | None, class_id: int) -> str:
    if names and 0 <= class_id < len(names):
        return names[class_id]
    return str(class_id)
