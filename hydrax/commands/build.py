"""``hydrax shards build``: write shards, each with its index, from an image folder, a manifest or files."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys

from ._common import RAY_HELP, add_s3_options, connect_ray, field_name, positive_int, progress, report, sizes_summary, store_options

DESCRIPTION = """\
Write WebDataset-style tar shards, each with its .hidx index, from

  an image folder   one subfolder per class: fields <ext> (the image's bytes as
                    they are), cls (the class index, in sorted name order) and
                    label (the subfolder's name); key: the path without extension
  a manifest        .csv, .tsv, .jsonl or .parquet, one sample per row: file
                    columns (paths; the field is --file-column's FIELD or each
                    file's extension) and text columns (the field is the column
                    name); key: the __key__ column, else from the first file path
  files             several paths, or a .txt/.lst file of paths, one a line:
                    WebDataset's rule, key = the path up to the first dot of the
                    file name, field = the rest; files sharing a key form a sample

in sorted (folder) or given (manifest, list) order, or shuffled with --shuffle.
The same input and options give byte-identical shards. Each shard is written
under a temporary name and renamed (or, for s3://, uploaded) once complete; a
failed or interrupted build removes what it wrote. Every shard gets its index:
a .hidx file beside a local shard; for s3://, an index object beside the shard
and, at the end, the folder summary (hydrax-index.json) listing the new shards,
so ShardSet sets them up without reading them. Details: the hydrax.shards.build
documentation."""

EPILOG = """\
examples:
  hydrax shards build photos/ out/train-%06d.tar --maxsize 1GB --shuffle --seed 1 --workers 4
  hydrax shards build train.csv out/train-%06d.tar --file-column image=jpg
  hydrax shards build files.txt s3://bucket/data/train-%06d.tar --endpoint-url http://127.0.0.1:9000
  hydrax shards build /shared/photos/ s3://bucket/train-%06d.tar --shuffle --ray ray-head:6379"""

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def _size(text: str) -> float:
    """``3e9``, ``500MB``, ``1G``, ``64MiB`` as bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", text, re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write it like 3e9, 500MB or 1GiB)")
    return float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def register(shard_commands) -> None:
    parser = shard_commands.add_parser(
        "build", help="write shards (and their indexes) from an image folder, a manifest or files",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", help="an image folder, a manifest, a list file, or files")
    parser.add_argument("out", metavar="OUT_PATTERN",
                        help="the shards' names, with one number: out/train-%%06d.tar or s3://bucket/prefix/train-%%06d.tar")
    parser.add_argument("--source", choices=("folder", "manifest", "list", "files"),
                        help="what SRC is (default: a folder, a manifest by its suffix, a .txt/.lst list, else files)")
    parser.add_argument("--root", metavar="DIR", help="the folder relative paths and keys are relative to (manifest, list, "
                        "files; default: the manifest's or list's folder, or the deepest folder holding the files)")
    parser.add_argument("--file-column", action="append", metavar="COL[=FIELD]",
                        help="a manifest column of file paths, and optionally its field (repeatable; "
                        "default: the columns whose first value is an existing file)")
    parser.add_argument("--key-column", metavar="COL", help="the manifest column of keys (default: __key__ if present)")
    parser.add_argument("--maxcount", type=positive_int, default=100_000, metavar="N", help="samples per shard at most (default 100000)")
    parser.add_argument("--maxsize", type=_size, default=3e9, metavar="BYTES",
                        help="start a new shard past this many bytes of data: 3e9, 500MB, 1GiB (default 3GB)")
    parser.add_argument("--shuffle", action="store_true", help="write the samples in a random order, fixed by --seed")
    parser.add_argument("--seed", type=int, metavar="N", help="the shuffle's seed (numpy PCG64; default 0)")
    parser.add_argument("--workers", type=positive_int, default=min(4, os.cpu_count() or 1), metavar="N",
                        help="processes reading and checking files ahead of the writer (default: up to 4)")
    parser.add_argument("--check-images", action=argparse.BooleanOptionalAction, default=None,
                        help="decode each image with Pillow to catch broken files (default: on for an image folder)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip unreadable files and non-images with a warning instead of failing")
    parser.add_argument("--force", action="store_true", help="overwrite existing shards of OUT_PATTERN")
    parser.add_argument("--sizes", type=field_name, metavar="FIELD",
                        help="also record every sample's image width and height for FIELD (e.g. jpg) in the indexes, as "
                        "hydrax shards index --sizes does")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help=f"read, check and write {RAY_HELP}: the same shards as without; files and a local output must be "
                        "on a shared file system")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def _kind(sources: list[str]) -> str:
    from ..shards.build.sources import MANIFEST_SUFFIXES

    if len(sources) > 1:
        return "files"
    source = sources[0]
    if os.path.isdir(source):
        return "folder"
    suffix = os.path.splitext(source)[1].lower()
    if suffix in MANIFEST_SUFFIXES:
        return "manifest"
    return "list" if suffix in (".txt", ".lst", ".list") else "files"


def _samples(args: argparse.Namespace, kind: str, warn):
    from ..shards.build.sources import BuildError, samples_from_files, samples_from_folder, samples_from_list, samples_from_manifest

    missing = [s for s in args.sources if not os.path.lexists(s)]
    if missing:
        raise BuildError(f"{missing[0]}: does not exist")
    if kind == "files":
        folders = [s for s in args.sources if os.path.isdir(s)]
        if folders:
            raise BuildError(f"{folders[0]}: is a folder; an image folder is given alone (or with --source folder)")
        return samples_from_files(args.sources, root=args.root)
    if len(args.sources) > 1:
        raise BuildError(f"--source {kind} takes one SRC, got {len(args.sources)}")
    source = args.sources[0]
    if kind == "folder":
        if not args.out.startswith("s3://"):
            out = os.path.realpath(os.path.dirname(args.out) or ".")
            root = os.path.realpath(source)
            if out == root or out.startswith(root + os.sep):
                raise BuildError(f"the output folder {os.path.dirname(args.out) or '.'} lies inside the image folder {source}, "
                                 "where it would be read as a class; write the shards elsewhere")
        return samples_from_folder(source, skip_bad=args.skip_bad, warn=warn)
    if kind == "manifest":
        columns = None
        if args.file_column:
            columns = {}
            for spec in args.file_column:
                column, equals, field = spec.rpartition("=") if "=" in spec else (spec, "", "")
                columns[column] = field if equals else None
        return samples_from_manifest(source, root=args.root, file_columns=columns, key_column=args.key_column)
    return samples_from_list(source, root=args.root)


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _build_on_ray(args: argparse.Namespace, samples, common: dict, advance):
    """The build split over Ray tasks: a bar while the files are read and checked, then the
    build's own bar while the shards are written."""
    on_ray = connect_ray(args.ray)
    checking = progress(len(samples), "checking", "sample", args.quiet)
    open_bars = [checking]

    def written(count: int) -> None:
        while open_bars:  # the first round is over: its bar goes before the build's own starts
            open_bars.pop().close()
        advance(count)

    try:
        return on_ray.build_shards_on_ray(samples, args.out, progress=written, probed=checking.update, **common)
    finally:
        while open_bars:
            open_bars.pop().close()


def run(args: argparse.Namespace) -> int:
    from ..shards.build import build_shards
    from ..shards.build.sources import BuildError

    if args.seed is not None and not args.shuffle:
        report("shards build", "--seed only applies with --shuffle")
        return 2
    bar = None
    total = 0

    def advance(count: int) -> None:
        nonlocal bar
        if bar is None:  # opened on the first sample, so a build refused at the start shows none
            bar = progress(total, "building", "sample", args.quiet)
        bar.update(count)

    def warn(message: str) -> None:
        line = f"hydrax shards build: warning: {message}"
        if bar is not None and hasattr(bar, "write"):
            bar.write(line, file=sys.stderr)  # keeps the bar intact below the message
        else:
            print(line, file=sys.stderr)

    # A job scheduler stops a build with SIGTERM: clean up as for Ctrl+C, not die mid-shard.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        kind = args.source or _kind(args.sources)
        samples = _samples(args, kind, warn)
        total = len(samples)
        check = args.check_images if args.check_images is not None else kind == "folder"
        common = dict(maxcount=args.maxcount, maxsize=args.maxsize, shuffle_seed=(args.seed or 0) if args.shuffle else None,
                      check_images=check, skip_bad=args.skip_bad, force=args.force, s3_options=store_options(args), warn=warn,
                      sizes=args.sizes)
        try:
            if args.ray is None:
                result = build_shards(samples, args.out, workers=args.workers, progress=advance, **common)
            else:
                result = _build_on_ray(args, samples, common, advance)
        finally:
            if bar is not None:
                bar.close()
    except (BuildError, OSError, ValueError, ImportError) as exc:
        report("shards build", exc)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not args.quiet:
        unit = "images/s" if kind == "folder" else "samples/s"
        skipped = f", {len(result.skipped)} skipped" if result.skipped else ""
        print(f"wrote {len(result.shards)} shards ({result.samples} samples{skipped}, {result.shard_bytes / 1e6:.1f} MB) "
              f"to {args.out} in {result.seconds:.2f} s: {result.rate:.0f} {unit}")
        if args.sizes:
            print(sizes_summary(args.sizes, result.size_counts))
    return 0
