"""Type stubs for the compiled kernels in ``_core.pyx`` (see that file, and the ``.pxi`` files it includes, for what each does)."""

from typing import Any, Callable

import numpy as np

class ArenaMap:
    size: int
    writable: bool
    def __init__(self, fd: int, size: int, writable: bool = True) -> None: ...
    @property
    def address(self) -> int: ...
    def call_before_unmap(self, callback: Callable[[], object] | None) -> None: ...
    def write_int64(self, offset: int, value: int) -> None: ...
    def read_int64(self, offset: int) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class SlotLease:
    slot: int
    def __init__(self, arena: ArenaMap, slot: int, offset: int, length: int, on_free: Callable[[int], object]) -> None: ...
    @property
    def exports(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def seal(self) -> None: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def heartbeat(arena: ArenaMap, offset: int, period_us: int) -> None: ...
def mark_item(arena: ArenaMap, offset: int, task: int, position: int) -> None: ...
def monotonic_ns() -> int: ...
def scan_tar(data: Any, out: np.ndarray) -> tuple[int, int, int]: ...
def index_tar(
    data: Any,
) -> tuple[int, int, list[bytes], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
def check_index(
    key_ends: np.ndarray,
    sample_ends: np.ndarray,
    entry_field: np.ndarray,
    entry_offset: np.ndarray,
    entry_size: np.ndarray,
    key_bytes: int,
    fields: int,
    shard_size: int,
) -> int: ...
def read_image_header(data: Any) -> tuple[int, int, int, int, int, int]: ...
def read_image_headers(
    data: Any,
    starts: np.ndarray,
    lengths: np.ndarray,
    statuses: np.ndarray,
    formats: np.ndarray,
    widths: np.ndarray,
    heights: np.ndarray,
    orientations: np.ndarray,
    offsets: np.ndarray,
) -> int: ...
def convert_pixels(
    src: np.ndarray,
    out: np.ndarray,
    chw: bool,
    lin: np.ndarray,
    matrix: np.ndarray,
    encode: int,
    curve: np.ndarray,
    byte_curve: np.ndarray,
    second: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
) -> None: ...

class Taps:
    in_size: int
    out_size: int
    ksize: int
    first: int
    last: int
    needed: bool
    def __init__(self, in_size: int, in0: float, in1: float, out_size: int, kind: int) -> None: ...
    def arrays(self) -> tuple[np.ndarray, np.ndarray]: ...

def resample_into(
    src: np.ndarray,
    out: np.ndarray,
    chw: bool,
    flip: bool,
    columns: Taps,
    rows: Taps,
    colour: tuple | None,
) -> None: ...
def jpeg_plane_layout(
    width: int, height: int, sampling: tuple[tuple[int, int], ...]
) -> tuple[tuple[tuple[int, int, int, int, int], ...], int]: ...

class JpegLibrary:
    path: str
    def __init__(self, path: str) -> None: ...
    def decode_planes(
        self,
        data: memoryview | bytes,
        width: int,
        height: int,
        sampling: tuple[tuple[int, int], ...],
        buffer: np.ndarray,
        stop: int = -1,
        start: int = 0,
    ) -> int: ...
    @property
    def scanlines(self) -> bool: ...
    def decode_region(
        self,
        data: memoryview | bytes,
        width: int,
        height: int,
        components: int,
        denom: int,
        left: int,
        top: int,
        right: int,
        bottom: int,
        buffer: np.ndarray,
    ) -> tuple[int, int]: ...

def planar_kernels(most: int = -1) -> int: ...
def resample_planes_into(
    y: np.ndarray,
    cb: np.ndarray,
    cr: np.ndarray,
    out: np.ndarray,
    chw: bool,
    flip: bool,
    luma_columns: Taps,
    luma_rows: Taps,
    chroma_columns: Taps,
    chroma_rows: Taps,
    colour: tuple | None,
) -> None: ...
def feistel_permute(n: int, keys: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None: ...
def feistel_windows(
    positions: np.ndarray,
    cum: np.ndarray,
    shard_starts: np.ndarray,
    run_shards: np.ndarray,
    run_starts: np.ndarray,
    keys: np.ndarray,
    out: np.ndarray,
) -> None: ...
def shuffle_runs(data: np.ndarray, bounds: np.ndarray, key: np.ndarray) -> None: ...
def mixture_slots(
    slots: np.ndarray,
    batch_size: int,
    ends: np.ndarray,
    before: np.ndarray,
    epoch_start: np.ndarray,
    source: np.ndarray,
    stream: np.ndarray,
) -> None: ...
def mixture_locate(items: np.ndarray, offsets: np.ndarray, source: np.ndarray, local: np.ndarray) -> int: ...
def mixture_items(
    source: np.ndarray,
    stream: np.ndarray,
    sizes: np.ndarray,
    offsets: np.ndarray,
    first_pass: np.ndarray,
    key_rows: np.ndarray,
    keys: np.ndarray,
    out: np.ndarray,
) -> None: ...
class MixtureBlock:
    batch_size: int
    run_batches: int
    batch_count: int
    block_first_batch: int
    first_run: int
    def __init__(
        self,
        batch_size: int,
        run_batches: int,
        batch_count: int,
        block_first_batch: int,
        first_run: int,
        shuffle_keys: np.ndarray,
        ends: np.ndarray,
        before: np.ndarray,
        epoch_start: np.ndarray,
        sizes: np.ndarray,
        offsets: np.ndarray,
        first_pass: np.ndarray,
        key_rows: np.ndarray,
        pass_keys: np.ndarray,
    ) -> None: ...
    def fill(self, first: int, out: np.ndarray) -> None: ...
def scan_jpeg_markers(data: Any) -> tuple[int, int, tuple[tuple[int, int], ...], tuple[int, int] | None, tuple[tuple[int, int], ...]] | None: ...
def random_resized_draws(
    seed: int,
    stream: int,
    tries: int,
    width: int,
    height: int,
    low_scale: float,
    high_scale: float,
    low_ratio: float,
    high_ratio: float,
) -> tuple[int, int, int, int] | None: ...
