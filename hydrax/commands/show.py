"""``hydrax show``: a PNG contact sheet of samples: each image fitted into a square tile, with its
key and label written under it. From shards, or from the batches of a ZeroMQ stream (``hydrax
serve``, tensorcom's servers)."""

from __future__ import annotations

import argparse
import math
import os

from ._common import CommandError, add_s3_options, count, report, shard_options
from .monitor import add_stream_options, open_stream

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
               "From a ZeroMQ URL (zsub://, zpull://, zrpull://, zrsub://) it receives batches until it has\n"
               "COUNT images: the images are the first 4-D uint8 or float array (NHWC, or NCHW when the\n"
               "last dimension is not 1, 3 or 4 channels; floats in [0, 1] are scaled by 255, others\n"
               "stretched from their minimum to their maximum), the labels the first 1-D integer array\n"
               "(tensorshow's imgclass mode); --image-field and --label-field pick arrays by the names\n"
               "they were sent with. The caption is the item index (hydrax protocol) or batch/row.\n\n"
               "examples:\n  hydrax show 'data/train-{0000..0099}.tar' --out grid.png\n"
               "  hydrax show --count 64 --shuffle --seed 1 --tile 96 'data/train-*.tar' --out grid.png\n"
               "  hydrax show zsub://127.0.0.1:7880 --count 32 --per-batch 4 --out stream.png",
    )
    parser.add_argument("shards", nargs="+", metavar="SHARDS|URL",
                        help="shard paths, globs, brace patterns (train-{0000..0099}.tar) or s3://, gs://, http(s):// or hf://datasets/ORG/NAME[@REV]/ URLs; or a ZeroMQ URL to receive from")
    parser.add_argument("--out", "-o", required=True, metavar="PNG", help="the PNG file to write")
    parser.add_argument("--force", "-f", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--count", "-n", type=count, default=16, metavar="N", help="how many samples (default 16)")
    parser.add_argument("--shuffle", action="store_true", help="N samples drawn at random (see --seed), not the first N (shards only)")
    parser.add_argument("--seed", type=int, default=0, help="the seed for --shuffle (default 0)")
    parser.add_argument("--tile", type=count, default=128, metavar="PX", help="the tile's side in pixels (default 128)")
    parser.add_argument("--columns", type=count, metavar="N", help="tiles per row (default: a square grid)")
    parser.add_argument("--image-field", metavar="FIELD", help="the field holding the image (default: the first image field)")
    parser.add_argument("--label-field", metavar="FIELD", help="the field holding the label (default: cls, else label)")
    parser.add_argument("--per-batch", type=count, default=0, metavar="N",
                        help="from a stream: at most N images of each batch (default 0: all of them)")
    add_stream_options(parser, "ZeroMQ streams")
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
    from ..serve.urls import is_zmq_url

    if any(is_zmq_url(text) for text in args.shards):
        return _run_stream(args, out)
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
    if not _write(grid, out, args):
        return 1
    for message in problems:
        report("show", message)
    print(f"wrote {args.out}: {chosen} samples in a {columns}x{math.ceil(chosen / columns)} grid, {grid.width}x{grid.height} px")
    return 1 if problems else 0


def _write(grid, out: str, args: argparse.Namespace) -> bool:
    """Save the grid to ``out``; False after reporting why it could not be."""
    try:
        _save(grid, out, args.force)
    except FileExistsError:
        report("show", f"{args.out} exists; pass --force to overwrite it")
        return False
    except OSError as exc:
        report("show", f"{args.out}: cannot write it: {exc.strerror or exc}")
        return False
    return True


def _canvas(tiles: int, columns: int, tile: int):
    """An empty grid of ``tiles`` tiles, its drawing context and the caption font."""
    from PIL import Image, ImageDraw, ImageFont

    grid = Image.new("RGB", grid_size(tiles, columns, tile), _BACKGROUND)
    return grid, ImageDraw.Draw(grid), ImageFont.load_default()


def _paint(canvas, number: int, columns: int, tile: int, image, caption: tuple[str, ...]) -> None:
    """Put ``image`` (a PIL image; None crosses the tile out) fitted into tile ``number``, captioned."""
    from PIL import Image, ImageOps

    grid, draw, font = canvas
    left = PAD + (number % columns) * (tile + PAD)
    top = PAD + (number // columns) * (tile + CAPTION + PAD)
    if image is None:
        draw.rectangle((left, top, left + tile - 1, top + tile - 1), outline=_FAILED)
        draw.line((left, top, left + tile - 1, top + tile - 1), fill=_FAILED)
        draw.line((left, top + tile - 1, left + tile - 1, top), fill=_FAILED)
    else:
        image = ImageOps.contain(image, (tile, tile), Image.Resampling.BICUBIC)
        grid.paste(image, (left + (tile - image.width) // 2, top + (tile - image.height) // 2))
    for line, text in enumerate(caption):
        draw.text((left, top + tile + 1 + line * LINE), _fit(draw, text, font, tile), fill=_TEXT, font=font)


def _draw(shards, positions: list[int], columns: int, tile: int, image_field: str | None, label_fields):
    """The grid image, and a message for each sample that could not be shown."""
    from ..image import ImageError
    from ..shards.stats import open_rgb
    from ..shards.tarindex import is_image_field

    canvas = _canvas(len(positions), columns, tile)
    problems = []
    for number, position in enumerate(positions):
        sample = shards[position]
        field = image_field or next((name for name in sample if is_image_field(name)), None)
        label = next((_first_line(sample[name]) for name in label_fields if name in sample), "")
        image = None
        try:
            if field is None or field not in sample:
                wanted = f"field {image_field!r}" if image_field else "image field"
                raise ImageError(f"has no {wanted} (its fields: {', '.join(sample)})")
            image = open_rgb(sample[field], orient=True)
        except ImageError as exc:
            where = f" field {field!r}" if field is not None and field in sample else ""
            problems.append(f"{sample.url}: sample {sample.key!r}{where}: {exc}")
        _paint(canvas, number, columns, tile, image, (sample.key, label))
    return canvas[0], problems


# -- from a ZeroMQ stream ------------------------------------------------------------------------


def _run_stream(args: argparse.Namespace, out: str) -> int:
    """``hydrax show URL``: the first ``--count`` images of the stream's batches, in a grid."""
    from ..serve import ServeError
    from ..serve.urls import is_zmq_url

    if not all(is_zmq_url(text) for text in args.shards):
        report("show", "give shards or ZeroMQ URLs, not both")
        return 2
    if args.shuffle:
        report("show", "--shuffle draws samples from shards; a stream's images come in the order they are sent")
        return 2
    try:
        connection = open_stream(args.shards, args)
    except CommandError as exc:
        report("show", exc)
        return 1
    tiles: list[tuple] = []
    batches = 0
    try:
        with connection:
            for message in connection.messages():
                if message.kind != "data":
                    continue
                batches += 1
                tiles += stream_images(message, batches, args.image_field, args.label_field, args.per_batch)
                if len(tiles) >= args.count:
                    break
    except (CommandError, ServeError) as exc:
        report("show", exc)
        return 1
    except KeyboardInterrupt:
        report("show", "interrupted")
        return 130
    where = ", ".join(args.shards)
    if not tiles:
        report("show", f"{where}: the stream ended before any batch came")
        return 1
    tiles = tiles[:args.count]
    columns = args.columns or math.ceil(math.sqrt(len(tiles)))
    canvas = _canvas(len(tiles), columns, args.tile)
    for number, (image, caption) in enumerate(tiles):
        _paint(canvas, number, columns, args.tile, image, caption)
    grid = canvas[0]
    if not _write(grid, out, args):
        return 1
    print(f"wrote {args.out}: {len(tiles)} images of {batches} batches from {where} in a {columns}x{math.ceil(len(tiles) / columns)} "
          f"grid, {grid.width}x{grid.height} px")
    return 0


def _pick(arrays, infos, name: str | None, wanted, what: str) -> int | None:
    """The position of the array named ``name``, else of the first for which ``wanted(array)``."""
    if name is not None:
        if name not in infos:
            raise CommandError(f"the batches have no array named {name!r} for the {what} (their arrays: {', '.join(infos) or 'unnamed'})")
        return infos.index(name)
    return next((i for i, a in enumerate(arrays) if wanted(a)), None)


def _is_images(a) -> bool:
    return a.ndim == 4 and (a.dtype.kind == "f" or a.dtype == "uint8")


def stream_images(message, number: int, image_name: str | None = None, label_name: str | None = None,
                  per_batch: int = 0) -> list[tuple]:
    """``(PIL image, (caption, label))`` for the images of one received batch (message ``number``).

    The images are the array named ``image_name``, else the first 4-D uint8 or float array; the
    labels the array named ``label_name``, else the first 1-D integer array as long as the batch.
    """
    import numpy as np

    arrays, infos = message.arrays, list(message.infos)
    which = _pick(arrays, infos, image_name, _is_images, "images")
    if which is None:
        raise CommandError(f"batch {number} has no images (a 4-D uint8 or float array): its arrays are "
                           + ", ".join(f"{a.dtype} {tuple(a.shape)}" for a in arrays))
    images = np.asarray(arrays[which])
    if images.ndim != 4:
        raise CommandError(f"the array {image_name!r} is {images.dtype} {images.shape}, not a batch of images")
    if images.shape[-1] not in (1, 3, 4) and images.shape[1] in (1, 3, 4):
        images = images.transpose(0, 2, 3, 1)  # NCHW
    if images.shape[-1] not in (1, 3, 4):
        raise CommandError(f"batch {number}'s images are {images.dtype} {tuple(arrays[which].shape)}: neither NHWC nor NCHW "
                           "with 1, 3 or 4 channels")
    labels = None
    position = _pick(arrays, infos, label_name, lambda a: a.ndim == 1 and a.dtype.kind in "iu" and len(a) == len(images), "labels")
    if position is not None:
        labels = np.asarray(arrays[position]).reshape(-1)
    items = message.items
    rows = len(images) if not per_batch else min(per_batch, len(images))
    tiles = []
    for row in range(rows):
        key = f"item {items[row]}" if items and row < len(items) else f"batch {number} #{row}"
        label = str(labels[row]) if labels is not None and row < len(labels) else ""
        tiles.append((to_pil(images[row]), (key, label)))
    return tiles


def to_pil(image):
    """A PIL RGB image of one HWC image array: uint8 as is; floats in [0, 1] times 255, other
    floats stretched from their minimum (0) to their maximum (255); 1 channel is grey, 4 RGBA."""
    import numpy as np
    from PIL import Image

    if image.dtype.kind == "f":
        pixels = np.nan_to_num(np.asarray(image, np.float32))
        lo, hi = float(pixels.min()), float(pixels.max())
        if lo < 0 or hi > 1:
            pixels = (pixels - lo) / (hi - lo) if hi > lo else np.zeros_like(pixels)
        image = np.clip(pixels * 255 + 0.5, 0, 255).astype(np.uint8)
    image = np.ascontiguousarray(image, np.uint8)
    if image.shape[-1] == 1:
        return Image.fromarray(image[..., 0], "L").convert("RGB")
    return Image.fromarray(image, "RGBA" if image.shape[-1] == 4 else "RGB").convert("RGB")


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
