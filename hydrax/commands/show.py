"""``hydrax show``: a PNG contact sheet of samples: each image fitted into a square tile, with its
key and label written under it."""

from __future__ import annotations

import argparse
import math
import os

from ._common import add_s3_options, count, report, shard_options

#: Pixels between tiles and around the grid.
PAD = 4
#: Height of one caption line; a tile's caption is two (key, label).
LINE = 12
CAPTION = 2 * LINE
_BACKGROUND = (24, 24, 24)
_TEXT = (235, 235, 235)
_FAILED = (200, 40, 40)


def register(commands) -> None:
    parser = commands.add_parser(
        "show", help="write a PNG grid of sample images with their keys and labels", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The grid is COLUMNS*(TILE+4)+4 pixels wide and ROWS*(TILE+28)+4 high (COLUMNS default\n"
               "ceil(sqrt(COUNT))). The image is the first field ending .jpg .png .webp ... (or\n"
               "--image-field), shown upright and in sRGB; the label is the cls (else label) field.\n"
               "A sample that cannot be shown is crossed out, named on stderr, and makes the exit status 1.\n\n"
               "examples:\n  hydrax show 'data/train-{0000..0099}.tar' --out grid.png\n"
               "  hydrax show --count 64 --shuffle --seed 1 --tile 96 'data/train-*.tar' --out grid.png",
    )
    parser.add_argument("shards", nargs="+", help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3:// URLs")
    parser.add_argument("--out", "-o", required=True, metavar="PNG", help="the PNG file to write")
    parser.add_argument("--force", "-f", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--count", "-n", type=count, default=16, metavar="N", help="how many samples (default 16)")
    parser.add_argument("--shuffle", action="store_true", help="N samples drawn at random (see --seed), not the first N")
    parser.add_argument("--seed", type=int, default=0, help="the seed for --shuffle (default 0)")
    parser.add_argument("--tile", type=count, default=128, metavar="PX", help="the tile's side in pixels (default 128)")
    parser.add_argument("--columns", type=count, metavar="N", help="tiles per row (default: a square grid)")
    parser.add_argument("--image-field", metavar="FIELD", help="the field holding the image (default: the first image field)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the label (default: cls, else label)")
    add_s3_options(parser)
    parser.set_defaults(run=run)


def grid_size(tiles: int, columns: int, tile: int) -> tuple[int, int]:
    """(width, height) in pixels of a grid of ``tiles`` tiles of side ``tile`` in ``columns`` columns."""
    rows = math.ceil(tiles / columns)
    return columns * (tile + PAD) + PAD, rows * (tile + CAPTION + PAD) + PAD


def run(args: argparse.Namespace) -> int:
    if args.tile < 16 or args.count < 1:
        report("show", f"--tile must be at least 16 and --count at least 1, got {args.tile} and {args.count}")
        return 2
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not args.force:
        report("show", f"{args.out} exists; pass --force to overwrite it")
        return 1
    if not os.path.isdir(os.path.dirname(out)):
        report("show", f"{args.out}: the folder {os.path.dirname(out)} does not exist")
        return 1
    import numpy as np

    from ..shards import ShardFormatError, ShardSet
    from ..shards.stats import LABEL_FIELDS

    try:
        shards = ShardSet(args.shards, write_index=False, **shard_options(args))
    except (OSError, ShardFormatError, ValueError, NotImplementedError, ImportError) as exc:
        report("show", exc)
        return 1
    if not len(shards):
        report("show", f"{' '.join(args.shards)}: no samples to show")
        return 1
    chosen = min(args.count, len(shards))
    if args.shuffle:
        positions = np.random.default_rng(args.seed).choice(len(shards), chosen, replace=False).tolist()
    else:
        positions = list(range(chosen))
    columns = args.columns or math.ceil(math.sqrt(chosen))
    labels = (args.label_field,) if args.label_field else LABEL_FIELDS
    try:
        grid, problems = _draw(shards, positions, columns, args.tile, args.image_field, labels)
    except (OSError, ShardFormatError) as exc:
        report("show", exc)
        return 1
    try:
        _save(grid, out, args.force)
    except FileExistsError:
        report("show", f"{args.out} exists; pass --force to overwrite it")
        return 1
    except OSError as exc:
        report("show", f"{args.out}: cannot write it: {exc.strerror or exc}")
        return 1
    for message in problems:
        report("show", message)
    print(f"wrote {args.out}: {chosen} samples in a {columns}x{math.ceil(chosen / columns)} grid, {grid.width}x{grid.height} px")
    return 1 if problems else 0


def _draw(shards, positions: list[int], columns: int, tile: int, image_field: str | None, label_fields):
    """The grid image, and a message for each sample that could not be shown."""
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    from ..image import ImageError
    from ..shards.stats import open_rgb
    from ..shards.tarindex import is_image_field

    grid = Image.new("RGB", grid_size(len(positions), columns, tile), _BACKGROUND)
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default()
    problems = []
    for number, position in enumerate(positions):
        sample = shards[position]
        left = PAD + (number % columns) * (tile + PAD)
        top = PAD + (number // columns) * (tile + CAPTION + PAD)
        field = image_field or next((name for name in sample if is_image_field(name)), None)
        label = next((_first_line(sample[name]) for name in label_fields if name in sample), "")
        try:
            if field is None or field not in sample:
                wanted = f"field {image_field!r}" if image_field else "image field"
                raise ImageError(f"has no {wanted} (its fields: {', '.join(sample)})")
            image = ImageOps.contain(open_rgb(sample[field], orient=True), (tile, tile), Image.Resampling.BICUBIC)
            grid.paste(image, (left + (tile - image.width) // 2, top + (tile - image.height) // 2))
        except ImageError as exc:
            where = f" field {field!r}" if field is not None and field in sample else ""
            problems.append(f"{sample.url}: sample {sample.key!r}{where}: {exc}")
            draw.rectangle((left, top, left + tile - 1, top + tile - 1), outline=_FAILED)
            draw.line((left, top, left + tile - 1, top + tile - 1), fill=_FAILED)
            draw.line((left, top + tile - 1, left + tile - 1, top), fill=_FAILED)
        for line, text in enumerate((sample.key, label)):
            draw.text((left, top + tile + 1 + line * LINE), _fit(draw, text, font, tile), fill=_TEXT, font=font)
    return grid, problems


def _first_line(data) -> str:
    text = bytes(data).decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else ""


def _fit(draw, text: str, font, width: int) -> str:
    """``text``, cut short with ".." to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "..", font=font) > width:
        text = text[:-1]
    return text + ".."


def _save(grid, out: str, force: bool) -> None:
    """Write ``grid`` as a PNG to ``out`` through a temporary file beside it, so a reader never
    sees half a file; without ``force`` the final step fails rather than replace an existing file."""
    temporary = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{os.getpid()}.tmp")
    try:
        with open(temporary, "xb") as f:
            grid.save(f, format="PNG")
        if force:
            os.replace(temporary, out)
        else:
            # a hard link fails if ``out`` appeared meanwhile, where a rename would overwrite it
            try:
                os.link(temporary, out)
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links
                if os.path.exists(out):
                    raise FileExistsError(out) from None
                os.replace(temporary, out)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
