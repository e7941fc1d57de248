"""The samples a build writes, and where they come from: an image folder, a manifest, or files.

A *source* function turns its input into an ordered list of :class:`SourceSample` s (a key, the
files whose bytes become fields, and text fields) without reading any file, so every naming
problem (an unsafe key, a column that names no field, two files giving one field) is found
before :func:`hydrax.shards.build.build_shards` writes anything. The mapping from each source to
samples, and the rules for keys, are described in :mod:`hydrax.shards.build`; this module holds
them, with :class:`BuildError`, which every step of a build raises.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ...errors import HydraxError
from ..tarindex import IMAGE_EXTENSIONS

#: Manifest kinds by file suffix.
MANIFEST_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


class BuildError(HydraxError, ValueError):
    """A source or output the build refuses; the message names the file, row, key or URL."""


@dataclass
class SourceSample:
    """One sample to write: its key, files to read into fields, and fields given as they are.

    :param key: the ``__key__``, already checked.
    :param files: field name -> path of the file whose bytes become the field.
    :param values: field name -> text (or bytes) stored as it is.
    :param origin: where the sample came from (a path, or a manifest's line), for messages.
    """

    key: str
    files: dict[str, str] = field(default_factory=dict)
    values: dict[str, str | bytes] = field(default_factory=dict)
    origin: str = ""


# --- keys -------------------------------------------------------------------------------------


def _is_metadata(part: str) -> bool:
    return len(part) > 4 and part.startswith("__") and part.endswith("__")


def check_key(key: str, origin: str = "") -> str:
    """``key`` when it is safe to write (see "Keys" in :mod:`hydrax.shards.build`), else :class:`BuildError` naming it."""
    where = f"{origin}: " if origin else ""
    parts = key.split("/")
    if not key:
        problem = "is empty"
    elif key.startswith("/"):
        problem = "is absolute, so extracting the shard would write outside the output folder"
    elif any(part in ("", ".", "..") for part in parts):
        problem = "has an empty, '.' or '..' part, so extracting the shard would write outside the output folder"
    elif "\\" in key or "\0" in key:
        problem = "holds a backslash or NUL, which tools read as a path separator or an end"
    elif "." in parts[-1]:
        problem = "has a '.' in its last part, where readers would cut the key"
    elif _is_metadata(parts[0]):
        problem = "starts with a __name__ part, which readers skip as metadata"
    else:
        return key
    raise BuildError(f"{where}key {key!r} {problem}")


def _derived_key(relative: str) -> str:
    """A key from a path relative to the root: no last extension, no other dot in the name."""
    folder, _, name = relative.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    stem = stem.replace(".", "_")
    return f"{folder}/{stem}" if folder else stem


def _unique(samples: list[SourceSample]) -> list[SourceSample]:
    """Give each derived key that repeats an earlier one the first free ``-N`` suffix."""
    taken = {s.key for s in samples}
    assigned: set[str] = set()
    for sample in samples:
        if sample.key in assigned:
            n = 2
            while f"{sample.key}-{n}" in taken:
                n += 1
            sample.key = f"{sample.key}-{n}"
            taken.add(sample.key)
        assigned.add(sample.key)
    return samples


def _relative(path: str, root: str, origin: str, remedy: str = "") -> str:
    """``path`` relative to ``root`` (posix form), refused when it lies outside ``root``."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if relative == ".." or relative.startswith("../") or os.path.isabs(relative):
        raise BuildError(f"{origin}: file {path!r} lies outside {root}, so its key would escape the output folder; "
                         f"give a root that holds it (--root){remedy}")
    return relative.replace(os.sep, "/")


def warner(warn: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """``warn``, or by default :func:`warnings.warn`: where a build's warnings go."""
    return warn if warn is not None else (lambda message: warnings.warn(message, stacklevel=3))


# --- image folders ----------------------------------------------------------------------------


def _files_below(folder: str, relative: str, ancestors: frozenset) -> Iterator[str]:
    """Relative paths of the files below ``folder``, skipping hidden names and link loops."""
    with os.scandir(folder) as entries:
        found = [e for e in entries if not e.name.startswith(".")]
    for entry in found:
        path = f"{relative}/{entry.name}"
        if entry.is_dir():
            stat = entry.stat()
            if (stat.st_dev, stat.st_ino) in ancestors:
                continue  # a link back up the tree: following it would never end
            yield from _files_below(entry.path, path, ancestors | {(stat.st_dev, stat.st_ino)})
        else:
            yield path


def samples_from_folder(root: str | os.PathLike, *, skip_bad: bool = False,
                        warn: Callable[[str], Any] | None = None) -> list[SourceSample]:
    """The samples of a class-per-subfolder image folder (see :mod:`hydrax.shards.build` for the mapping).

    :param skip_bad: skip files that are not images (by extension), with a warning, instead of
        failing.
    :param warn: called with each warning (default :func:`warnings.warn`).
    """
    root = os.fspath(root)
    warn = warner(warn)
    if not os.path.isdir(root):
        raise BuildError(f"{root}: not a folder")
    with os.scandir(root) as entries:
        visible = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    stray = [e.path for e in visible if not e.is_dir()]
    if stray:
        raise BuildError(
            f"{stray[0]}: lies directly in the image folder {root}, so it has no label; an image folder needs "
            "one subfolder per class (or build from a list of files: --source files)"
        )
    classes = [e.name for e in visible]
    if not classes:
        raise BuildError(f"{root}: holds no class subfolders (an image folder needs one subfolder per class)")
    top = os.stat(root)
    samples = []
    for index, label in enumerate(classes):
        folder = os.path.join(root, label)
        stat = os.stat(folder)
        relatives = sorted(_files_below(folder, label, frozenset({(top.st_dev, top.st_ino), (stat.st_dev, stat.st_ino)})),
                           key=lambda r: r.split("/"))
        if not relatives:
            warn(f"class folder {folder} holds no files; its class keeps the index {index}")
        for relative in relatives:
            path = os.path.join(root, relative)
            name = relative.rsplit("/", 1)[-1]
            extension = name.rsplit(".", 1)[1].lower() if "." in name else ""
            if extension not in IMAGE_EXTENSIONS:
                problem = f"{path}: not an image (its extension is {'.' + extension if extension else 'missing'}); an image folder holds only images"
                if not skip_bad:
                    raise BuildError(problem + " (--skip-bad skips such files)")
                warn(f"skipping {problem}")
                continue
            key = check_key(_derived_key(relative), path)
            samples.append(SourceSample(key, {extension: path}, {"cls": str(index), "label": label}, path))
    if not samples:
        raise BuildError(f"{root}: holds no images")
    return _unique(samples)


# --- manifests --------------------------------------------------------------------------------


def _cell(value: Any) -> str | bytes | None:
    """A manifest cell as field data; None when it is empty."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        return value or None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value) or None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (bool, int, float, list, dict)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        import pandas

        if pandas.isna(value):
            return None
    except (ImportError, TypeError, ValueError):
        pass
    return str(value)


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "a list" if isinstance(value, list) else "an object"


def _csv_rows(path: str, delimiter: str) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise BuildError(f"{path}: empty; a manifest starts with a header row naming its columns")
        rows = []
        for cells in reader:
            if not cells:
                continue
            origin = f"{path} line {reader.line_num}"
            if len(cells) != len(header):
                raise BuildError(f"{origin}: has {len(cells)} cells, the header has {len(header)}")
            rows.append((origin, dict(zip(header, cells))))
    return header, rows


def _jsonl_rows(path: str) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    columns: list[str] | None = None
    kinds: dict[str, tuple[str, int]] = {}
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            origin = f"{path} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BuildError(f"{origin}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise BuildError(f"{origin}: not a JSON object; each line of a JSON Lines manifest is one object")
            if columns is None:
                columns, first = list(row), number
            elif set(row) != set(columns):
                missing, extra = sorted(set(columns) - set(row)), sorted(set(row) - set(columns))
                raise BuildError(
                    f"{origin}: has different keys from line {first}"
                    + (f"; lacks {', '.join(map(repr, missing))}" if missing else "")
                    + (f"; adds {', '.join(map(repr, extra))}" if extra else "")
                )
            for name, value in row.items():
                if value is None:
                    continue
                kind = _json_kind(value)
                seen = kinds.setdefault(name, (kind, number))
                if seen[0] != kind:
                    raise BuildError(f"{origin}: column {name!r} holds {kind}, but {seen[0]} on line {seen[1]}")
            rows.append((origin, row))
    if columns is None:
        raise BuildError(f"{path}: holds no rows")
    return columns, rows


def _parquet_rows(path: str) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    try:
        import pyarrow  # noqa: F401  (pandas reads Parquet through it)
    except ImportError:
        raise ImportError(f"{path}: reading Parquet manifests needs pyarrow: pip install pyarrow") from None
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{path}: reading Parquet manifests needs pandas: pip install pandas pyarrow") from None
    frame = pandas.read_parquet(path, engine="pyarrow")
    columns = [str(c) for c in frame.columns]
    rows = [(f"{path} row {i}", dict(zip(columns, values)))
            for i, values in enumerate(frame.itertuples(index=False, name=None))]
    return columns, rows


def _field_name(name: str, what: str, origin: str) -> str:
    field_name = name.lower()
    if not field_name or "/" in field_name or field_name.startswith(("_", ".")) or "\0" in field_name:
        raise BuildError(
            f"{origin}: {what} {name!r} cannot name a field (a field name is not empty, has no '/', and does not "
            "start with '_' or '.')"
        )
    return field_name


def _manifest_rows(path: str, kind: str) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """The columns and the rows (each with where it comes from) of a manifest of ``kind``; at least
    one row, and no column named twice."""
    if kind in ("csv", "tsv"):
        columns, rows = _csv_rows(path, "," if kind == "csv" else "\t")
    elif kind == "jsonl":
        columns, rows = _jsonl_rows(path)
    else:
        columns, rows = _parquet_rows(path)
    if not rows:
        raise BuildError(f"{path}: holds no rows")
    if len(set(columns)) != len(columns):
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        raise BuildError(f"{path}: names the column {repeated[0]!r} more than once")
    return columns, rows


def _file_columns(path: str, columns: list[str], first_row: tuple[str, dict[str, Any]], root: str, key_column: str | None,
                  file_columns: Mapping[str, str | None] | Sequence[str] | None) -> dict[str, str | None]:
    """The file columns, each with its field name (None: each file's extension): those given, or
    else those whose value in the first row is the path of an existing file with an extension."""
    if file_columns is None:
        first_origin, first = first_row
        chosen: dict[str, str | None] = {}
        for column in columns:
            value = first.get(column)
            if column != key_column and isinstance(value, str) and "." in os.path.basename(value).lstrip(".") \
                    and os.path.isfile(value if os.path.isabs(value) else os.path.join(root, value)):
                chosen[column] = None
        if not chosen:
            raise BuildError(f"{first_origin}: no column names an existing file (relative to {root}); "
                             "name the file columns (--file-column)")
        return chosen
    chosen = dict(file_columns) if isinstance(file_columns, Mapping) else dict.fromkeys(file_columns)
    for column in chosen:
        if column not in columns:
            raise BuildError(f"{path}: has no column {column!r} (its columns: {', '.join(columns)})")
        if column == key_column:
            raise BuildError(f"{path}: the column {column!r} cannot give both files and keys")
    return chosen


def _text_columns(path: str, columns: list[str], chosen: dict[str, str | None], key_column: str | None) -> dict[str, str]:
    """The text columns, each with its field name, once no two columns (file columns with a
    field name included) give the same field."""
    fixed = {c: _field_name(f, "field", path) for c, f in chosen.items() if f is not None}
    text = {c: _field_name(c, "column", path) for c in columns if c not in chosen and c != key_column}
    names = list(fixed.values()) + list(text.values())
    if len(set(names)) != len(names):
        repeated = min(n for n in names if names.count(n) > 1)
        raise BuildError(f"{path}: two columns give the field {repeated!r} (field names are lower-cased)")
    return text


def samples_from_manifest(path: str | os.PathLike, *, root: str | os.PathLike | None = None,
                          file_columns: Mapping[str, str | None] | Sequence[str] | None = None,
                          key_column: str | None = None) -> list[SourceSample]:
    """The samples of a CSV, TSV, JSON Lines or Parquet manifest, one per row (see :mod:`hydrax.shards.build`).

    :param root: the folder relative file paths (and derived keys) are relative to (default: the
        manifest's folder).
    :param file_columns: the columns that hold file paths: a mapping of column -> field name
        (None: each file's extension), or a sequence of column names; default: detected from the
        first row.
    :param key_column: the column that gives the keys (default ``__key__`` when there is one;
        else keys come from the first file column's paths).
    """
    path = os.fspath(path)
    kind = MANIFEST_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise BuildError(f"{path}: a manifest is .csv, .tsv, .jsonl, .ndjson or .parquet")
    root = os.fspath(root) if root is not None else (os.path.dirname(path) or ".")
    columns, rows = _manifest_rows(path, kind)
    if key_column is None and "__key__" in columns:
        key_column = "__key__"
    if key_column is not None and key_column not in columns:
        raise BuildError(f"{path}: has no key column {key_column!r} (its columns: {', '.join(columns)})")
    chosen = _file_columns(path, columns, rows[0], root, key_column, file_columns)
    text = _text_columns(path, columns, chosen, key_column)

    samples = []
    keys_given: dict[str, str] = {}
    for origin, row in rows:
        files: dict[str, str] = {}
        from_column: dict[str, str] = {}
        first_path = None
        for column, field_name in chosen.items():
            value = _cell(row.get(column))
            if not isinstance(value, str):
                raise BuildError(f"{origin}: column {column!r} is {'empty' if value is None else 'not a path'}")
            file_path = value if os.path.isabs(value) else os.path.join(root, value)
            if field_name is None:
                name = os.path.basename(value)
                if "." not in name.lstrip("."):
                    raise BuildError(f"{origin}: file {value!r} (column {column!r}) has no extension to name its "
                                     f"field; name it: --file-column {column}=FIELD")
                field_name = _field_name(name.rsplit(".", 1)[1], "extension of", origin)
            if field_name in files or field_name in text.values():
                other = from_column.get(field_name) or next(c for c, f in text.items() if f == field_name)
                raise BuildError(f"{origin}: columns {other!r} and {column!r} both give the field {field_name!r}; "
                                 f"name the fields: --file-column {column}=FIELD")
            files[field_name] = file_path
            from_column[field_name] = column
            first_path = first_path or file_path
        values = {}
        for column, field_name in text.items():
            value = _cell(row.get(column))
            if value is None:
                raise BuildError(f"{origin}: column {column!r} is empty")
            values[field_name] = value
        if key_column is not None:
            key = _cell(row.get(key_column))
            if not isinstance(key, str):
                raise BuildError(f"{origin}: the key column {key_column!r} is {'empty' if key is None else 'not text'}")
            check_key(key, origin)
            if key in keys_given:
                raise BuildError(f"{origin}: key {key!r} repeats the key of {keys_given[key]}")
            keys_given[key] = origin
        else:
            relative = _relative(first_path, root, origin, ", or a __key__ column")
            key = check_key(_derived_key(relative), origin)
        samples.append(SourceSample(key, files, values, origin))
    return samples if key_column is not None else _unique(samples)


# --- lists of files ---------------------------------------------------------------------------


def _samples_from_paths(entries: Iterable[tuple[str, str]], root: str) -> list[SourceSample]:
    grouped: dict[str, SourceSample] = {}
    for path, origin in entries:
        relative = _relative(path, root, origin)
        folder, _, name = relative.rpartition("/")
        stem, dot, rest = name.partition(".")
        if not stem:
            raise BuildError(f"{origin}: file name {name!r} starts with '.', so it has no key")
        if not dot or not rest:
            raise BuildError(f"{origin}: file name {name!r} has no extension, so it names no field")
        key = check_key(f"{folder}/{stem}" if folder else stem, origin)
        field_name = _field_name(rest, "extension", origin)
        sample = grouped.setdefault(key, SourceSample(key, origin=origin))
        if field_name in sample.files:
            raise BuildError(f"{origin}: gives key {key!r} the field {field_name!r} a second time "
                             f"(first from {sample.files[field_name]})")
        sample.files[field_name] = path
    if not grouped:
        raise BuildError("no files to build from")
    return list(grouped.values())


def samples_from_files(paths: Iterable[str | os.PathLike], *, root: str | os.PathLike | None = None) -> list[SourceSample]:
    """The samples of the files ``paths`` by WebDataset's rule (see :mod:`hydrax.shards.build`).

    :param root: the folder keys are relative to (default: the deepest folder holding every file).
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise BuildError("no files to build from")
    if root is None:
        root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
    return _samples_from_paths(((p, p) for p in paths), os.fspath(root))


def samples_from_list(list_path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> list[SourceSample]:
    """The samples of the files named in the text file ``list_path``, one path a line.

    :param root: relative paths, and keys, are relative to it (default: the list's folder).
    """
    list_path = os.fspath(list_path)
    root = os.fspath(root) if root is not None else (os.path.dirname(list_path) or ".")
    entries = []
    with open(list_path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line and not line.startswith("#"):
                entries.append((line if os.path.isabs(line) else os.path.join(root, line), f"{list_path} line {number}"))
    if not entries:
        raise BuildError(f"{list_path}: names no files")
    return _samples_from_paths(entries, root)
