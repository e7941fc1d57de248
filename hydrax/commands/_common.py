"""What the subcommands share: S3 options, progress bars, a look at the first samples, and reporting failures."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import HydraxError


class CommandError(HydraxError):
    """A failure to report in one line (naming the file or URL) with exit status 1."""

    #: the command's exit status
    status = 1


class UsageError(CommandError):
    """Options that do not go together, to report in one line with exit status 2."""

    status = 2


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts and sizes: a whole number of at least 1 (argparse then
    names the flag and exits 2 for anything else)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type`` for durations: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def field_name(text: str) -> str:
    """An argparse ``type`` for a sample's field (``--sizes jpg``): lower-cased, as shard indexes
    name fields."""
    if not text or text.startswith(".") or "/" in text:
        raise argparse.ArgumentTypeError(f"not a field name: {text!r} (write it as a shard's members end, e.g. jpg)")
    return text.lower()


def sizes_summary(field: str, counts) -> str:
    """The summary line of image sizes recorded for ``field`` (a
    :class:`~hydrax.shards.sizecolumn.SizeCounts` summed over the shards)."""
    zero = counts.lacking + counts.unreadable
    return (f"image sizes of field {field!r}: {counts.sized} samples with a size, {zero} recorded as 0x0 "
            f"({counts.lacking} without the field, {counts.unreadable} whose header could not be read)")


#: How many samples at the start of the shards ``bench`` and ``serve`` look at before the run: for
#: an image field, and (serve) for labels that are class numbers, so shards without them fail at once.
PROBE_SAMPLES = 64


def first_samples(dataset) -> list:
    """The first :data:`PROBE_SAMPLES` samples of ``dataset`` (fewer if it holds fewer); reading
    them loads the first shard's index now, if the dataset loads indexes lazily."""
    return [dataset[i] for i in range(min(PROBE_SAMPLES, len(dataset)))]


def add_s3_options(parser: argparse.ArgumentParser) -> None:
    """``--endpoint-url`` and ``--region`` for ``s3://`` (and ``gs://``) URLs; credentials come the
    standard AWS (or Google) way."""
    group = parser.add_argument_group("object stores", "for s3:// and gs:// URLs; credentials come from the environment "
                                      "or the AWS / Google configuration (for hf:// URLs: HF_TOKEN or the stored Hugging "
                                      "Face login, and HF_ENDPOINT)")
    group.add_argument("--endpoint-url", metavar="URL", help="an S3-compatible endpoint, or a GCS emulator for gs:// (default: AWS, Google)")
    group.add_argument("--region", help="the region (default: from the AWS configuration)")


def s3_options(args: argparse.Namespace):
    """The :class:`hydrax.shards.S3Options` the arguments ask for."""
    from ..shards import S3Options

    return S3Options(endpoint_url=getattr(args, "endpoint_url", None), region=getattr(args, "region", None))


def store_options(args: argparse.Namespace):
    """The :class:`hydrax.shards.StoreOptions` the arguments ask for (``--endpoint-url`` serves
    whichever of s3:// and gs:// the URLs use)."""
    from ..shards import GCSOptions, StoreOptions

    endpoint = getattr(args, "endpoint_url", None)
    return StoreOptions(s3=s3_options(args), gcs=GCSOptions(endpoint_url=endpoint))


def shard_options(args: argparse.Namespace) -> dict:
    """ShardSet's store keywords (``s3=``, ``gcs=``) the arguments ask for."""
    options = store_options(args)
    return {"s3": options.s3, "gcs": options.gcs}


RAY_HELP = ("on a Ray cluster (ADDRESS, else RAY_ADDRESS or the one this machine runs, else a local one); the AWS_*, "
            "GOOGLE_* and HF_* variables of this environment go to its tasks")


def connect_ray(address: str) -> Any:
    """:mod:`hydrax.ray`, connected to the cluster ``--ray`` names, its tasks given this
    environment's store variables (credentials, region, endpoint), as the command without
    ``--ray`` would read with."""
    from .. import ray as on_ray
    from ..ray.runtime import connect
    from ..shards.options import store_environment

    connect(address, log_to_driver=False, runtime_env={"env_vars": store_environment()})
    return on_ray


def progress(total: int | None, description: str, unit: str, quiet: bool = False) -> Any:
    """A tqdm bar on stderr when tqdm is installed and output is wanted, else a silent stand-in."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=description, unit=unit, disable=quiet, file=sys.stderr)
    except ImportError:
        return _Silent()


class _Silent:
    def update(self, _n: int = 1) -> None:
        pass

    def set_postfix_str(self, _text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        pass


def report(command: str, message: object) -> None:
    """Print ``hydrax COMMAND: message`` on stderr."""
    print(f"hydrax {command}: {message}", file=sys.stderr)


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """``rows`` under ``headers`` in aligned columns (those numbered in ``right`` right-aligned)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)
