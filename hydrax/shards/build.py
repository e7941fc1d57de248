"""Building shards from files: an image folder, a manifest, or a list of files.

Building takes two steps. A *source* function turns the input into an ordered list of
:class:`SourceSample` s (a key, the files whose bytes become fields, and text fields) without
reading any file, so every naming problem is found before anything is written.
:func:`build_shards` then reads the files (in parallel, but in order), optionally checks that
images decode, and writes the samples with :class:`~hydrax.shards.ShardWriter`. The same samples
and options always give byte-identical shards.

.. rubric:: How each source becomes samples

**An image folder** (:func:`samples_from_folder`): ``ROOT/<class>/.../<name>.<ext>``. Every
subfolder of ``ROOT`` is a class, numbered from 0 in sorted name order (by code point, so
``"10"`` sorts before ``"2"``); every file below a class folder, at any depth, is one sample:

- ``__key__``: the path relative to ``ROOT`` without its last extension, each ``.`` left in the
  file name replaced by ``_`` (``cat/img.001.JPG`` gives ``cat/img_001``);
- ``<ext>``: the file's bytes as they are, never re-encoded; the field is the file's extension,
  lower-cased and otherwise unchanged (``.JPG`` gives ``jpg``, ``.jpeg`` stays ``jpeg``);
- ``cls``: the class index, as decimal text (``"0"``);
- ``label``: the class name (the subfolder's name).

Samples are sorted by path, compared folder by folder. Names starting with ``.`` are skipped;
symbolic links are followed. A file directly in ``ROOT`` has no label and is an error, and so
is a file whose extension is not in :data:`~hydrax.shards.tarindex.IMAGE_EXTENSIONS` (unless ``skip_bad``).

**A manifest** (:func:`samples_from_manifest`): a CSV or TSV file with a header row, a JSON Lines
file (one object per line, every object with the same keys), or a Parquet file. Each row is one
sample, in row order:

- *file columns* hold paths, relative to ``root`` (default: the manifest's folder) unless
  absolute; each file's bytes become a field named by the column's ``FIELD`` when given
  (``file_columns={"image": "jpg"}``), else by the file's extension, lower-cased. Without
  ``file_columns``, the file columns are those whose value in the first row is the path of an
  existing file that has an extension;
- ``__key__``: the key column's value (``key_column``, default the column ``__key__`` if there
  is one), as it is; else derived from the first file column's path relative to ``root``, as
  for an image folder (a path outside ``root`` cannot give a key, and is refused);
- every other column is a text field named by the column name, lower-cased (readers lower-case
  field names anyway): CSV cells as they are; JSON strings as they are, other JSON values as
  compact JSON (``3``, ``true``, ``[1,2]``); Parquet strings and bytes as they are, other values
  as JSON, or their ``str()``.

An empty cell (an empty string, a JSON ``null``, a missing key, a Parquet null or NaN) is an
error naming the row and column, and so is a JSON column holding text in one row and a number
in another.

**A list of files** (:func:`samples_from_files`, :func:`samples_from_list`): WebDataset's own
rule. A file's key is its path relative to ``root`` up to the first ``.`` of its name, the field
is the rest, lower-cased; files sharing a key form one sample (``a/1.jpg`` and ``a/1.seg.png``
give the sample ``a/1`` with fields ``jpg`` and ``seg.png``). Samples come in the order of
their first file. In a list file, relative paths are relative to ``root`` (default: the list's
folder); blank lines and lines starting with ``#`` are skipped.

.. rubric:: Keys

Derived keys that coincide (``a.b.jpg`` and ``a_b.jpg``; ``x.jpg`` and ``x.png`` in an image
folder; one file named by two manifest rows) are made unique: the first keeps its key, each
later one gets ``-2``, ``-3``, ... (the first such suffix no other key has). Keys given in a key
column must be unique already. Every key is refused, naming it, when extracting the shard would
write outside the output folder or readers would misread it: an absolute key, a ``..``, ``.``
or empty path part, a backslash, a ``.`` in its last part (readers cut the key there), or a
first part like ``__name__`` (readers skip those members as metadata).

.. rubric:: Output

A local ``pattern`` such as ``out/train-%06d.tar``: each shard is written under a temporary name
in a hidden folder beside the shards, with its ``.hidx`` index, and both are renamed into place
once complete. An ``s3://bucket/prefix/train-%06d.tar`` pattern: each shard is written to a local
temporary folder and uploaded once complete, followed by its index object (the shard's URL
plus ``.hidx``, tied to the version just written); when the build ends, the folder summary
(``hydrax-index.json``) is updated with the new shards, so a :class:`~hydrax.shards.ShardSet`
over that folder sets up with one request and reads no shard to index it. Either way, a build that fails or is interrupted removes what it has written, so no
partial shard is ever left under a final name, and a build refuses to start when any file of the
pattern exists, unless ``force``.
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import HydraxError, ObjectNotFoundError
from .indexfile import ShardIndex, index_path
from .options import S3Options, StoreOptions
from .publish import write_summaries
from .router import store_for
from .shardtable import INDEX_SUFFIX, ShardEntry
from .store import is_remote
from .tarindex import IMAGE_EXTENSIONS
from .verify import decode_check
from .writer import ShardWriter

#: Extensions (lower-cased, without the dot) that an image folder may hold, and that
#: ``check_images`` decodes in other sources.

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


@dataclass
class BuildReport:
    """What :func:`build_shards` wrote.

    :param shards: the shards' final paths or URLs, in order.
    :param samples: samples written.
    :param payload_bytes: bytes of field data written.
    :param shard_bytes: bytes of the shards themselves (tar headers and padding included).
    :param seconds: wall time of the build.
    :param skipped: one message per sample skipped with ``skip_bad``.
    """

    shards: list[str]
    samples: int
    payload_bytes: int
    shard_bytes: int
    seconds: float
    skipped: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Samples written per second."""
        return self.samples / self.seconds if self.seconds > 0 else math.inf


# --- keys -------------------------------------------------------------------------------------


def _is_metadata(part: str) -> bool:
    return len(part) > 4 and part.startswith("__") and part.endswith("__")


def check_key(key: str, origin: str = "") -> str:
    """``key`` when it is safe to write (see "Keys" in the module docs), else :class:`BuildError` naming it."""
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
    """The samples of a class-per-subfolder image folder (see the module docs for the mapping).

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
    """The samples of a CSV, TSV, JSON Lines or Parquet manifest, one per row (see the module docs).

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
    """The samples of the files ``paths`` by WebDataset's rule (see the module docs).

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


# --- output -----------------------------------------------------------------------------------

_CONVERSION = re.compile(r"%(?:%|(0\d+)?d)?")


def _parse_pattern(pattern: str) -> tuple[str, str]:
    """(the text before the number, the text after it), or :class:`BuildError`."""
    fields = []
    for match in _CONVERSION.finditer(pattern):
        if match.group(0) == "%%":
            continue
        if not match.group(0).endswith("d"):
            fields = []
            break
        fields.append(match)
    hint = "; write it like out/train-%06d.tar"
    if len(fields) != 1:
        raise BuildError(f"output pattern {pattern!r} must hold exactly one number field such as %06d{hint}")
    head, tail = pattern[: fields[0].start()], pattern[fields[0].end():]
    if "/" in tail:
        raise BuildError(f"output pattern {pattern!r}: the number must be in the file name, not a folder{hint}")
    if not tail.endswith(".tar"):
        raise BuildError(f"output pattern {pattern!r} must end in .tar (shards are uncompressed tar files){hint}")
    return head.replace("%%", "%"), tail.replace("%%", "%")


class _Output:
    """Where finished shards go: renamed into place (local) or uploaded with an index object
    beside each (remote)."""

    def __init__(self, pattern: str, options: S3Options | StoreOptions | None) -> None:
        if pattern[:7].lower() == "file://":
            pattern = pattern[7:]
        self.pattern = pattern
        self.remote = is_remote(pattern)
        head, tail = _parse_pattern(pattern)
        self.options = options if isinstance(options, StoreOptions) else StoreOptions(s3=options or S3Options())
        if not self.remote and "://" in pattern:
            store_for(pattern, self.options)  # ftp:// and the like: StoreError, not a folder named "ftp:"
        self.matches = re.compile(re.escape(head.rpartition("/")[2]) + r"\d+" + re.escape(tail) + r"(\.hidx)?")
        self.published: list[str] = []
        self.entries: list[ShardEntry] = []  # uploaded shards, for the folder summary
        self.sizes = 0
        self._uploads: deque[Future] = deque()
        self._uploader: ThreadPoolExecutor | None = None
        self._created: str | None = None
        if self.remote:
            self.folder = pattern.rpartition("/")[0]
            self.store = store_for(pattern, self.options)
            self.temp = tempfile.mkdtemp(prefix="hydrax-build-")
        else:
            self.folder = os.path.dirname(pattern) or "."
            if not os.path.isdir(self.folder):
                self._created = self.folder
                os.makedirs(self.folder)
            # In the output folder, so the rename onto the final name never crosses filesystems.
            self.temp = tempfile.mkdtemp(prefix=".hydrax-build-", dir=self.folder)
        self.temp_pattern = os.path.join(self.temp, os.path.basename(pattern))

    def existing(self) -> list[str]:
        """The files (or objects) of the pattern that exist already."""
        if not self.remote:
            return sorted(os.path.join(self.folder, n) for n in os.listdir(self.folder) if self.matches.fullmatch(n))
        prefix = self.folder + "/"
        try:
            found = self.store.list(prefix)
        except ObjectNotFoundError as exc:
            raise exc._replace(url=prefix, subject=exc.lead()) from exc
        names = [info.url[len(prefix):] for info in found]
        return [prefix + name for name in names if "/" not in name and self.matches.fullmatch(name)]

    def publish(self, temporary: str) -> None:
        """Move the finished shard ``temporary`` to its final name (ShardWriter's ``post``)."""
        name = os.path.basename(temporary)
        self.sizes += os.path.getsize(temporary)
        if not self.remote:
            final = os.path.join(self.folder, name)
            # The shard first: a final name then only ever holds a complete shard, and an index is
            # rebuilt from its shard if a crash separates them.
            os.replace(temporary, final)
            self.published.append(final)
            if os.path.exists(index_path(temporary)):
                os.replace(index_path(temporary), index_path(final))
            return
        # Upload in the background while the next shard is written; at most two shards wait on
        # local disk.
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="hydrax-upload")
        while len(self._uploads) >= 2:
            self._uploads.popleft().result()
        self._uploads.append(self._uploader.submit(self._upload, temporary, f"{self.folder}/{name}"))

    def _upload(self, temporary: str, url: str) -> None:
        info = self.store.upload(url, temporary)
        self.published.append(url)
        # The index object beside it, tied to the version just written: ShardSet then sets up
        # without reading the shard.
        index = ShardIndex.load(index_path(temporary))
        index.etag = info.version
        self.store.write(url + INDEX_SUFFIX, index.to_bytes())
        self.entries.append(ShardEntry(url, info.size, info.version, len(index)))
        os.unlink(temporary)
        os.unlink(index_path(temporary))

    def finish(self, summary: bool = True) -> None:
        """Wait for uploads (then, with ``summary``, write the folder summary), and remove the
        temporary folder."""
        while self._uploads:
            self._uploads.popleft().result()
        if summary:
            self.write_summary(self.entries)
        self._close()

    def write_summary(self, entries: Sequence[ShardEntry]) -> None:
        """Add ``entries`` to the folder summary of a remote pattern (nothing for a local one)."""
        if self.remote and entries:
            write_summaries(entries, self.options)

    def remove(self, numbers: Iterable[int]) -> None:
        """Delete the shards of these numbers and their indexes, where they exist."""
        for number in numbers:
            final = self.pattern % number
            for path in (final, index_path(final) if not self.remote else final + INDEX_SUFFIX):
                try:
                    if self.remote:
                        self.store.delete(path)
                    elif os.path.exists(path):
                        os.unlink(path)
                except Exception:  # noqa: BLE001 - best effort: the failure being cleaned up matters more
                    pass

    def abort(self) -> None:
        """Remove everything this build wrote: temporary files and finished shards."""
        for upload in self._uploads:
            upload.cancel()
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
        for final in self.published:
            try:
                if self.remote:
                    self.store.delete(final)
                    self.store.delete(final + INDEX_SUFFIX)
                else:
                    for path in (final, index_path(final)):
                        if os.path.exists(path):
                            os.unlink(path)
            except Exception:
                pass  # best effort: the original failure is what gets reported
        self.published = []
        self._close()
        if self._created is not None:
            try:
                os.rmdir(self._created)
            except OSError:
                pass

    def _close(self) -> None:
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader = None
        shutil.rmtree(self.temp, ignore_errors=True)


# --- reading ----------------------------------------------------------------------------------


def _check_image(path: str, data: bytes, where: str) -> None:
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ImportError("checking images needs Pillow: pip install Pillow (or do not check images: --no-check-images)") from None
    try:
        # What verify --decode and the loaders do (an embedded profile for other data is refused
        # too), to a small image: a reduced JPEG decode still reads every byte of the
        # entropy-coded data, so it finds truncation and corruption at a fraction of the cost.
        decode_check(data)
    except Exception as exc:  # ImageError, ProfileError, or any of Pillow's plugins' errors
        raise BuildError(f"{path}{where}: not a readable image ({exc})") from None


def _load(sample: SourceSample, check_images: bool) -> dict[str, Any] | BuildError:
    """The sample as ShardWriter takes it, or the :class:`BuildError` that describes its fault."""
    loaded: dict[str, Any] = {"__key__": sample.key, **sample.values}
    try:
        for name, path in sample.files.items():
            where = f" ({sample.origin})" if sample.origin != path else ""
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise BuildError(f"cannot read {path}{where}: {exc.strerror or exc}") from None
            if check_images and name.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
                _check_image(path, data, where)
            loaded[name] = data
    except BuildError as exc:
        return exc
    return loaded


def _probe(chunk: Sequence[SourceSample], check_images: bool) -> list[BuildError | None]:
    """What is wrong with each sample of ``chunk``, if anything (run in a worker process)."""
    verdicts = []
    for sample in chunk:
        loaded = _load(sample, check_images)
        verdicts.append(loaded if isinstance(loaded, BuildError) else None)
    return verdicts


def _start_worker() -> None:
    from ..procs.processes import die_with_parent

    # Ctrl+C reaches the whole process group: the parent cleans up and stops the pool (with
    # SIGTERM), so the workers should neither die mid-task nor print tracebacks of their own; a
    # SIGTERM handler inherited through fork would do the latter. A parent killed outright takes
    # them along instead of leaving them blocked on a file.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()


def _loaded(samples: Sequence[SourceSample], workers: int, check_images: bool) -> Iterator[tuple[SourceSample, Any]]:
    """Each sample with its :func:`_load` result, in order; ``workers`` processes work ahead."""
    if workers <= 1:
        for sample in samples:
            yield sample, _load(sample, check_images)
        return
    # The workers read (and check) each sample ahead of the writer, and return only a verdict;
    # this process then reads the bytes again, from the page cache. Shipping the bytes back
    # through a pipe would cost this process more than reading them, and this process (the tar
    # writer) is the bottleneck. Processes rather than threads, because Pillow's parsing and the
    # writer both hold the GIL much of the time. Chunks amortise the pool's cost per task; the
    # window bounds how far ahead the workers run.
    from ..procs.processes import start_method

    chunk = 64
    window: deque[tuple[Sequence[SourceSample], Any]] = deque()
    pool = multiprocessing.get_context(start_method()).Pool(workers, initializer=_start_worker)
    try:
        for start in range(0, len(samples), chunk):
            part = samples[start : start + chunk]
            window.append((part, pool.apply_async(_probe, (part, check_images))))
            while len(window) >= 2 * workers or (window and start + chunk >= len(samples)):
                part, verdicts = window.popleft()
                for sample, verdict in zip(part, verdicts.get()):
                    yield sample, verdict or _load(sample, False)
    except BaseException:
        # Failing, interrupted, or closed early by the writer's failure: a worker may be stuck on
        # a file that never answers (a hung network mount), so stop them rather than wait.
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


def shuffled(samples: Sequence[SourceSample], seed: int) -> list[SourceSample]:
    """``samples`` permuted by ``numpy.random.Generator(PCG64(seed)).permutation``."""
    order = np.random.Generator(np.random.PCG64(seed)).permutation(len(samples))
    return [samples[i] for i in order.tolist()]


def _write_samples(writer: ShardWriter, samples: Sequence[SourceSample], workers: int, check_images: bool, skip_bad: bool,
                   progress: Callable[[int], Any] | None, warn: Callable[[str], Any]) -> tuple[int, int, list[str]]:
    """Read and write every sample, in order: (samples written, their field bytes, why each
    skipped sample was skipped)."""
    written = payload = 0
    skipped: list[str] = []
    # closing(): the worker processes stop before the caller's cleanup, not whenever the
    # generator is collected.
    with closing(_loaded(samples, workers, check_images)) as loaded_samples:
        for sample, loaded in loaded_samples:
            if isinstance(loaded, BuildError):
                if not skip_bad:
                    raise loaded
                skipped.append(str(loaded))
                warn(f"skipping sample {sample.key!r}: {loaded}")
            else:
                payload += writer.write(loaded)
                written += 1
            if progress is not None:
                progress(1)
    return written, payload, skipped


def build_shards(samples: Sequence[SourceSample], pattern: str, *, maxcount: int = 100_000, maxsize: float = 3e9,
                 shuffle_seed: int | None = None, workers: int = 1, check_images: bool = False,
                 skip_bad: bool = False, force: bool = False, s3_options: S3Options | StoreOptions | None = None,
                 progress: Callable[[int], Any] | None = None,
                 warn: Callable[[str], Any] | None = None) -> BuildReport:
    """Write ``samples`` into shards named by ``pattern`` (see the module docs for the output).

    :param pattern: ``out/train-%06d.tar`` or ``s3://bucket/prefix/train-%06d.tar``: one number
        field (``%d`` or ``%0Nd``) in the file name, which ends in ``.tar``.
    :param maxcount: samples per shard at most.
    :param maxsize: field bytes per shard before a new one starts (as :class:`ShardWriter` counts).
    :param shuffle_seed: write the samples in the order :func:`shuffled` gives for this seed
        (default: as given).
    :param workers: with more than 1, that many processes read (and check) the files ahead of
        the writer, which then reads them again from the page cache; with 1, this process does it
        all. Worth it when checking images, or when reading is slow (a network file system).
    :param check_images: decode every file whose field is an image extension, with Pillow.
    :param skip_bad: skip samples whose files cannot be read or decoded, with a warning, instead
        of failing.
    :param force: overwrite existing files of the pattern (by default the build refuses to start).
    :param s3_options: endpoint, region and credentials for an ``s3://`` pattern (or a
        :class:`~hydrax.shards.StoreOptions` for any remote pattern).
    :param progress: called with the number of samples done, as they are done.
    :param warn: called with each warning (default :func:`warnings.warn`).
    """
    started = time.perf_counter()
    warn = warner(warn)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not samples:
        raise BuildError("no samples to write")
    _parse_pattern(pattern)
    output = _Output(pattern, s3_options)
    writer = None
    try:
        existing = _refuse_existing(output, force)
        if shuffle_seed is not None:
            samples = shuffled(samples, shuffle_seed)
        writer = ShardWriter(output.temp_pattern, maxcount, maxsize, post=output.publish)
        written, payload, skipped = _write_samples(writer, samples, workers, check_images, skip_bad, progress, warn)
        if not written:
            raise BuildError(f"every sample was skipped; nothing written to {pattern}")
        writer.close()
        output.finish()
    except BaseException:
        if writer is not None:
            writer.abort()
        output.abort()
        raise
    warn_stale(existing, output.published, warn)
    return BuildReport(list(output.published), written, payload, output.sizes, time.perf_counter() - started, skipped)


def _refuse_existing(output: _Output, force: bool) -> list[str]:
    existing = output.existing()
    if existing and not force:
        raise BuildError(f"{existing[0]}: exists{f' (and {len(existing) - 1} more files of the pattern)' if len(existing) > 1 else ''}; "
                         "the build would overwrite it (--force overwrites)")
    return existing


def warn_stale(existing: Sequence[str], published: Sequence[str], warn: Callable[[str], Any]) -> None:
    """Warn about files of the pattern from before the build that it did not overwrite."""
    stale = sorted(set(existing) - {p for f in published for p in (f, index_path(f), f + INDEX_SUFFIX)})
    if stale:
        warn(f"{len(stale)} files of the pattern from before remain ({stale[0]}, ...): delete them, or "
             "readers of the pattern will read them too")


# --- a build split into parts (hydrax.ray) ------------------------------------------------------
#
# A split build is the whole build's output, shard for shard: first every sample is read (and
# checked) to learn its payload, then the shard boundaries ShardWriter would choose are computed
# in one place, then each part writes whole shards from its first number on. Nothing but the
# samples' order and sizes decides a boundary, so the parts agree with one writer.


def payload_size(loaded: Mapping[str, Any]) -> int:
    """The bytes :meth:`ShardWriter.write <hydrax.shards.ShardWriter.write>` counts against
    ``maxsize`` for a sample: its fields' bytes (text as UTF-8), names starting with ``_`` aside."""
    return sum(len(value.encode("utf-8")) if isinstance(value, str) else len(value)
               for name, value in loaded.items() if not name.startswith("_"))


def probe_samples(samples: Sequence[SourceSample], check_images: bool) -> list[int | str]:
    """Read (and with ``check_images`` decode) each sample: its payload size, or why it cannot
    be written (a :class:`BuildError`'s words)."""
    out: list[int | str] = []
    for sample in samples:
        loaded = _load(sample, check_images)
        out.append(str(loaded) if isinstance(loaded, BuildError) else payload_size(loaded))
    return out


def shard_bounds(sizes: Sequence[int], maxcount: int, maxsize: float) -> list[tuple[int, int]]:
    """``(first, end)`` of each shard one :class:`~hydrax.shards.ShardWriter` writes for samples
    of these payload sizes, in order: a shard ends once it holds ``maxcount`` samples or
    ``maxsize`` bytes."""
    bounds: list[tuple[int, int]] = []
    first = count = payload = 0
    for number, size in enumerate(sizes):
        if number and (count >= maxcount or payload >= maxsize):
            bounds.append((first, number))
            first, count, payload = number, 0, 0
        count += 1
        payload += size
    if sizes:
        bounds.append((first, len(sizes)))
    return bounds


@dataclass
class PartReport:
    """What :func:`write_shard_range` wrote: the shards' paths or URLs, their index entries
    (remote), field bytes and shard bytes."""

    shards: list[str]
    entries: list[ShardEntry]
    payload_bytes: int
    shard_bytes: int


def check_output(pattern: str, s3_options: S3Options | StoreOptions | None, force: bool) -> list[str]:
    """The files of ``pattern`` that exist; :class:`BuildError` if any do and not ``force``."""
    _parse_pattern(pattern)
    output = _Output(pattern, s3_options)
    try:
        return _refuse_existing(output, force)
    finally:
        output.abort()


def write_shard_range(samples: Sequence[SourceSample], pattern: str, first_shard: int, shards: int, *, maxcount: int,
                      maxsize: float, s3_options: S3Options | StoreOptions | None = None) -> PartReport:
    """Write ``samples`` as the ``shards`` shards numbered from ``first_shard`` on, exactly as a
    whole build writes them when its shard ``first_shard`` starts with ``samples[0]``; no folder
    summary (see :func:`write_folder_summary`). A part that fails removes what it wrote; one whose
    files no longer give the planned shards (changed since they were probed) is a :class:`BuildError`."""
    output = _Output(pattern, s3_options)
    writer = None
    try:
        writer = ShardWriter(output.temp_pattern, maxcount, maxsize, start_shard=first_shard, post=output.publish)
        payload = 0
        for sample in samples:
            loaded = _load(sample, False)
            if isinstance(loaded, BuildError):
                raise loaded
            payload += writer.write(loaded)
        writer.close()
        if writer.shard - first_shard != shards:
            raise BuildError(f"the samples of shards {first_shard}..{first_shard + shards - 1} of {pattern} make "
                             f"{writer.shard - first_shard} shards now, not {shards}: their files changed during the build")
        output.finish(summary=False)
    except BaseException:
        if writer is not None:
            writer.abort()
        output.abort()
        raise
    return PartReport(list(output.published), list(output.entries), payload, output.sizes)


def write_folder_summary(pattern: str, entries: Sequence[ShardEntry], s3_options: S3Options | StoreOptions | None = None) -> None:
    """Add the shards of ``entries`` to the folder summary beside a remote ``pattern`` (what a
    whole build does at its end); nothing for a local pattern."""
    output = _Output(pattern, s3_options)
    try:
        output.write_summary(entries)
    finally:
        output._close()


def remove_shards(pattern: str, numbers: Iterable[int], s3_options: S3Options | StoreOptions | None = None) -> None:
    """Delete the shards of ``pattern`` with these numbers, and their indexes (a failed split build)."""
    output = _Output(pattern, s3_options)
    try:
        output.remove(numbers)
    finally:
        output._close()
