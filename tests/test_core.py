"""The Cython kernels: arena mapping, slot leases with export counting, heartbeat, item marks."""

import ctypes
import gc
import os
import threading
import time

import numpy as np
import pytest
from support.timing import slack

from hydrax import _core


def _mapping(size=1 << 16):
    fd = os.memfd_create("hydrax-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    try:
        return _core.ArenaMap(fd, size)
    finally:
        os.close(fd)


@pytest.fixture
def arena():
    return _mapping()


def test_arena_is_page_aligned_shared_and_stays_mapped_while_viewed(arena):
    assert arena.address % 4096 == 0 and arena.size == 1 << 16
    view = np.frombuffer(arena, dtype=np.int64)
    arena.write_int64(8, 42)
    assert view[1] == 42
    view[2] = 7
    assert arena.read_int64(16) == 7
    with pytest.raises(IndexError, match="outside the arena"):
        arena.read_int64(1 << 16)
    with pytest.raises(IndexError):
        arena.write_int64(3, 1)


@pytest.mark.filterwarnings("ignore:os.fork")
@pytest.mark.filterwarnings("ignore:This process")
def test_arena_memory_is_shared_with_a_child_process(arena):
    pid = os.fork()
    if pid == 0:
        arena.write_int64(0, 1234)
        os._exit(0)
    os.waitpid(pid, 0)
    assert arena.read_int64(0) == 1234


def test_the_unmap_hook_runs_once_after_the_last_view_is_gone():
    arena = _mapping()  # not the fixture: pytest holds fixtures until the test ends
    calls = []
    address = arena.address
    arena.call_before_unmap(lambda: calls.append(address))
    view = np.frombuffer(arena, dtype=np.uint8)
    del arena
    gc.collect()
    assert calls == []  # a view still uses the memory
    view[0] = 1
    del view
    gc.collect()
    assert calls == [address]


def test_an_unmap_hook_that_raises_does_not_keep_the_memory():
    arena = _mapping()

    def broken():
        raise RuntimeError("driver gone")

    arena.call_before_unmap(broken)
    del arena
    gc.collect()  # no exception escapes a deallocation


def test_bad_mapping_raises_oserror():
    with pytest.raises(OSError):
        _core.ArenaMap(-1, 4096)
    with pytest.raises(ValueError):
        _core.ArenaMap(0, 0)


def test_lease_fires_once_when_sealed_and_unused(arena):
    freed = []
    lease = _core.SlotLease(arena, 3, 4096, 4096, freed.append)
    a = np.frombuffer(lease, dtype=np.float32)
    b = a[10:20]  # a view of a view holds the same export
    assert lease.exports == 1
    lease.seal()
    assert freed == [] and not lease.released
    del a
    assert freed == []
    del b
    assert freed == [3] and lease.released
    with pytest.raises(BufferError, match="recycled"):
        np.frombuffer(lease, dtype=np.uint8)
    lease.seal()
    assert freed == [3]


def test_lease_without_exports_fires_on_seal(arena):
    freed = []
    lease = _core.SlotLease(arena, 0, 0, 64, freed.append)
    lease.seal()
    assert freed == [0]


def test_lease_points_at_its_slot(arena):
    lease = _core.SlotLease(arena, 1, 8192, 128, None)
    np.frombuffer(lease, dtype=np.int64)[0] = 99
    assert arena.read_int64(8192) == 99
    with pytest.raises(ValueError, match="outside the arena"):
        _core.SlotLease(arena, 1, (1 << 16) - 64, 128, None)


def test_release_on_another_thread_and_callback_errors_are_contained(arena, caplog):
    freed = []
    lease = _core.SlotLease(arena, 2, 0, 64, freed.append)
    view = np.frombuffer(lease, dtype=np.uint8)
    lease.seal()
    holder = [view]
    del view
    t = threading.Thread(target=holder.clear)
    t.start()
    t.join()
    assert freed == [2]

    def boom(slot):
        raise RuntimeError("callback failed")

    lease = _core.SlotLease(arena, 5, 0, 64, boom)
    with caplog.at_level("ERROR", logger="hydrax.procs.arena"):
        lease.seal()  # must not raise
    assert any("error recycling batch slot 5" in r.getMessage() for r in caplog.records)


@pytest.mark.cpu_only
def test_jax_array_pins_the_slot_until_it_is_collected(arena):
    jax = pytest.importorskip("jax")
    from hydrax.run.placement import collect_released_buffers

    freed = []
    lease = _core.SlotLease(arena, 0, 4096, 4096, freed.append)
    view = np.frombuffer(lease, dtype=np.float32)
    x = jax.device_put(view)
    assert x.unsafe_buffer_pointer() == view.ctypes.data  # XLA:CPU aliases aligned memory
    del view
    lease.seal()
    assert freed == []
    del x
    collect_released_buffers()
    gc.collect()
    assert freed == [0]


def test_heartbeat_runs_while_another_thread_holds_the_gil(arena):
    thread = threading.Thread(target=_core.heartbeat, args=(arena, 64, 10_000), daemon=True)
    thread.start()
    deadline = time.monotonic() + slack(10)  # its first beat, however late the thread is scheduled
    while arena.read_int64(64) == 0:
        assert time.monotonic() < deadline, "the heartbeat thread never beat"
        time.sleep(0.001)
    before = arena.read_int64(64)
    # Held long enough that a busy machine still runs the beating thread in the last third of it
    hold = slack(0.3)
    ctypes.PyDLL(None).usleep(int(hold * 1e6))  # PyDLL keeps the GIL held for the whole call
    after = arena.read_int64(64)
    assert after - before > 2 / 3 * hold * 1e9
    arena.write_int64(72, 1)
    thread.join(slack(1))
    assert not thread.is_alive()


def test_mark_item_records_task_position_and_time(arena):
    now = _core.monotonic_ns()
    _core.mark_item(arena, 128, 17, 5)
    later = _core.monotonic_ns()
    assert arena.read_int64(128) == 17 and arena.read_int64(136) == 5
    assert now <= arena.read_int64(144) <= later
    # Python's clock: read between two of its readings, whatever happens in between on a busy machine
    first = time.monotonic_ns()
    ours = _core.monotonic_ns()
    last = time.monotonic_ns()
    assert first <= ours <= last
    with pytest.raises(IndexError):
        _core.mark_item(arena, (1 << 16) - 8, 1, 1)


def test_pixel_kernel_refuses_mismatched_arguments():
    from hydrax._core import convert_pixels

    src = np.zeros((4, 5, 3), np.uint8)
    lin = np.zeros((3, 256), np.float32)
    eye = np.eye(3, dtype=np.float32)
    curve = np.linspace(0, 1, 5, dtype=np.float32)
    none = np.zeros(0, np.uint8)
    unit = np.ones(4, np.float32)

    def call(out, **kwargs):
        args = dict(chw=False, lin=lin, matrix=eye, encode=0, curve=curve, byte_curve=none, second=eye, scale=unit, offset=unit)
        args.update(kwargs)
        convert_pixels(src, out, args["chw"], args["lin"], args["matrix"], args["encode"], args["curve"], args["byte_curve"],
                       args["second"], args["scale"], args["offset"])

    with pytest.raises(ValueError, match="pixels are 4x5 but the output is 5x4"):
        call(np.zeros((5, 4, 3), np.float32))
    with pytest.raises(ValueError, match="cannot convert 3 channels into 2"):
        call(np.zeros((4, 5, 2), np.float32))
    with pytest.raises(ValueError, match="lin must be"):
        call(np.zeros((4, 5, 3), np.float32), lin=np.zeros((3, 16), np.float32))
    with pytest.raises(ValueError, match="unknown encoding 7"):
        call(np.zeros((4, 5, 3), np.float32), encode=7)
    out = np.zeros((3, 4, 5), np.float32)
    call(out, chw=True, encode=1, lin=np.ones((3, 256), np.float32) * 0.5, scale=np.full(4, 2, np.float32), offset=np.zeros(4, np.float32))
    assert (out == 1.0).all()


def test_index_check_kernel_agrees_with_its_twin():
    from hydrax import _fallback

    rng = np.random.default_rng(11)
    outcomes = set()
    for attempt in range(3000):
        samples = int(rng.integers(0, 6))
        counts = rng.integers(1, 4, samples)
        sample_ends = np.cumsum(counts).astype(np.int64)
        entries = int(sample_ends[-1]) if samples else 0
        key_ends = np.cumsum(rng.integers(0, 5, samples)).astype(np.int64)
        entry_field = rng.integers(0, 3, entries).astype(np.int32)
        entry_offset = rng.integers(0, 900, entries).astype(np.int64)
        entry_size = rng.integers(0, 100, entries).astype(np.int64)
        arrays = [key_ends, sample_ends, entry_field, entry_offset, entry_size]
        for _ in range(int(rng.integers(0, 3))):  # damage: a value changed, or an array cut short
            which = int(rng.integers(0, 5))
            if len(arrays[which]) and rng.random() < 0.8:
                arrays[which] = arrays[which].copy()
                big = np.iinfo(arrays[which].dtype).max
                arrays[which][rng.integers(0, len(arrays[which]))] = rng.choice([-1, 0, 2, 3, 5, 1000, big, -big])
            else:
                arrays[which] = arrays[which][: max(0, len(arrays[which]) - 1)].copy()
        key_bytes = int(key_ends[-1]) if samples and rng.random() < 0.9 else int(rng.integers(0, 4))
        args = (*arrays, key_bytes, 3, 1000)
        fast, slow = _core.check_index(*args), _fallback.check_index(*args)
        assert fast == slow, (attempt, args)
        outcomes.add(fast)
    assert outcomes == {0, 1, 2, 3, 4, 5}


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_convert_pixels_refuses_tables_with_nan_and_never_indexes_with_it(dtype):
    src = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    out = np.zeros((4, 5, 3), dtype)
    lin = np.tile(np.linspace(0, 1, 256, dtype=np.float32), (3, 1))
    eye, empty = np.eye(3, dtype=np.float32), np.zeros((3, 3), np.float32)
    curve = np.linspace(0, 1, 4097, dtype=np.float32)
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    for bad in ("lin", "matrix", "curve"):
        args = {"lin": lin.copy(), "matrix": eye.copy(), "curve": curve.copy()}
        args[bad].flat[7] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            _core.convert_pixels(src, out, False, args["lin"], args["matrix"], 0, args["curve"], np.zeros(0, np.uint8), empty, ones, zeros)
    # finite but absurd tables: the Oklab stage makes inf - inf = NaN, which must store as a
    # defined value (uint8 output used to convert NaN to an integer: undefined behaviour)
    huge = np.full((3, 3), 2.0e38, np.float32)
    second = np.array([[1, -1, 0]] * 3, np.float32)
    _core.convert_pixels(src, out, False, lin, huge, 2, curve, np.zeros(0, np.uint8), second, ones * 255, zeros)
    if dtype == np.uint8:
        assert (out[1:] == 0).all()  # NaN stored as 0 (row 0 starts with black: finite)


def test_the_type_stub_lists_exactly_the_compiled_names():
    import ast
    from pathlib import Path

    stub = Path(_core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    stubbed = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    compiled = {name for name in dir(_core) if not name.startswith("_") and getattr(getattr(_core, name), "__module__", None) == "hydrax._core"}
    assert stubbed == compiled
    assert stub.with_name("py.typed").exists()


def test_the_direct_srgb_codes_match_a_numpy_oracle_on_extreme_values():
    """8-bit sRGB output goes through a table of final codes indexed four values at a time (SSE2
    on x86-64): the indices must be the scalar arithmetic's, for -0.0, NaN, huge and out-of-range
    values alike."""
    from pathlib import Path

    from hydrax.image.transform import transform_for

    adobe = (Path(__file__).parent / "data" / "icc" / "AdobeRGB1998.icc").read_bytes()
    t = transform_for(adobe, "RGB", "srgb")  # a wide-gamut source: its sRGB output uses the code table
    assert len(t.byte_curve) > 1
    rng = np.random.default_rng(7)
    special = np.array([-0.0, 0.0, -1e-30, 1.0, 1.0000001, 0.99999994, -5.0, 7.0, 2.9e38, -2.9e38, 0.5, 3.0518e-05], np.float32)
    steps = np.float32(len(t.byte_curve) - 1)
    # values whose product with steps is exactly halfway between two indices: rounding goes up
    halves = ((np.arange(len(t.byte_curve) - 1) + 0.5) / steps).astype(np.float32)
    halves = np.concatenate([halves, np.nextafter(halves, np.float32(2)), np.nextafter(halves, np.float32(-1))])
    products = halves * steps
    ties = halves[products == np.floor(products) + np.float32(0.5)]
    assert len(ties) > 100
    special = np.concatenate([special, rng.choice(ties, 60)])
    # RGB and gray sources; three output channels (one pass per row, four pixels at a time) and
    # four (through planes, alpha last), HWC and CHW
    for trial in range(24):
        lin = rng.choice(np.concatenate([special, rng.uniform(-0.5, 1.5, 40).astype(np.float32)]), (3, 256)).astype(np.float32)
        matrix = (rng.uniform(-2, 2, (3, 3)) if trial % 2 else np.eye(3) * rng.choice([1.0, -1.0, 1e30])).astype(np.float32)
        channels, out_channels, chw = (3, 1)[trial % 3 == 2], (3, 4)[trial % 4 >= 2], trial % 5 >= 3
        src = rng.integers(0, 256, (9, 67, channels), np.uint8)
        out = np.zeros((out_channels, 9, 67) if chw else (9, 67, out_channels), np.uint8)
        # the real table, or random codes, so that a neighbouring index shows
        codes = t.byte_curve if trial % 3 == 0 else rng.integers(0, 256, len(t.byte_curve), np.uint8)
        _core.convert_pixels(src, out, chw, lin, matrix, 0, t.curve, codes, np.zeros((3, 3), np.float32),
                             np.full(4, 255, np.float32), np.zeros(4, np.float32))
        out = out.transpose(1, 2, 0) if chw else out
        assert (out[:, :, 3:] == 255).all()
        out = out[:, :, :3]
        with np.errstate(over="ignore", invalid="ignore"):
            r, g, b = (lin[c][src[:, :, c if channels == 3 else 0]] for c in range(3))
            mixed = [matrix[c, 0] * r + matrix[c, 1] * g + matrix[c, 2] * b for c in range(3)]  # float32, left to right
            expected = []
            for v in mixed:
                clipped = np.where((v >= 0) & (v <= 1), v, np.where(v > 1, np.float32(1), np.float32(0))).astype(np.float32)
                index = np.trunc((clipped * steps).astype(np.float64) + 0.5).astype(np.int64)
                expected.append(codes[index])
        np.testing.assert_array_equal(out, np.stack(expected, axis=2))
