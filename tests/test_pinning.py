"""Page-locking host memory through the CUDA driver: the fallback everywhere, the real thing on a GPU."""

import logging
import os
import threading

import numpy as np
import pytest

from hydrax import _core
from hydrax.procs import pinning
from hydrax.procs.pinning import PinnedRange, cuda_driver_available, pin_host_memory

HAVE_CUDA = cuda_driver_available()
SIZE = 1 << 20


@pytest.fixture
def mapping():
    """A memfd mapping like the arena's (MAP_SHARED, page aligned)."""
    fd = os.memfd_create("hydrax-test-pin", os.MFD_CLOEXEC)
    os.ftruncate(fd, SIZE)
    m = _core.ArenaMap(fd, SIZE)
    os.close(fd)
    return m


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_bad_arguments_raise(mapping):
    with pytest.raises(ValueError, match="address 0"):
        pin_host_memory(0, SIZE)
    with pytest.raises(ValueError, match="positive"):
        pin_host_memory(mapping.address, 0)
    with pytest.raises(ValueError, match="positive"):
        pin_host_memory(mapping.address, -4096)
    with pytest.raises(ValueError, match="negative"):
        pin_host_memory(mapping.address, SIZE, device_ordinal=-1)


def test_disabled_by_the_environment(mapping, monkeypatch, caplog):
    monkeypatch.setenv("HYDRAX_PIN_MEMORY", "0")
    with caplog.at_level(logging.DEBUG, logger="hydrax.procs.pinning"):
        assert pin_host_memory(mapping.address, SIZE) is None
    assert "HYDRAX_PIN_MEMORY=0" in caplog.text


@pytest.mark.skipif(HAVE_CUDA, reason="a CUDA driver and device are present")
def test_without_a_gpu_pinning_falls_back_and_leaves_nothing_behind(mapping, caplog):
    assert not cuda_driver_available()
    view = np.frombuffer(mapping, np.uint8)
    view[:] = 3
    fds, threads = open_fds(), threading.active_count()
    with caplog.at_level(logging.DEBUG, logger="hydrax.procs.pinning"):
        assert pin_host_memory(mapping.address, SIZE) is None
        assert pin_host_memory(mapping.address, SIZE) is None
    assert caplog.text
    assert open_fds() == fds and threading.active_count() == threads
    assert (view == 3).all()
    view[:] = 4
    assert mapping.read_int64(0) == 0x0404040404040404


def test_a_missing_driver_library_is_a_quiet_fallback(mapping, monkeypatch, caplog):
    monkeypatch.setattr(pinning, "_LIBRARY", "libcuda-hydrax-absent.so.1")
    monkeypatch.setattr(pinning, "_driver", None)
    monkeypatch.setattr(pinning, "_driver_error", None)
    assert not cuda_driver_available()
    with caplog.at_level(logging.DEBUG, logger="hydrax.procs.pinning"):
        assert pin_host_memory(mapping.address, SIZE) is None
    assert "no CUDA driver" in caplog.text
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


class FakeDriver(pinning._Driver):
    """Records the driver calls made and answers with preset results (0 unless told)."""

    def __init__(self, **results: int) -> None:  # no library behind it
        self.calls: list[tuple] = []
        self.results = results
        for name in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
                     "cuCtxPushCurrent", "cuCtxPopCurrent", "cuMemHostRegister", "cuMemHostUnregister"):
            setattr(self, name, self._recorder(name))

    def _recorder(self, name):
        def call(*args):
            self.calls.append((name, *(getattr(a, "value", a) for a in args if type(a).__name__ != "CArgObject")))
            if name == "cuDeviceGet":
                args[0]._obj.value = 5
            elif name == "cuDevicePrimaryCtxRetain":
                args[0]._obj.value = 0xC0DE
            return self.results.get(name, 0)
        return call

    @staticmethod
    def cuGetErrorName(result, out):
        out._obj.value = b"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED" if result == 712 else b"CUDA_ERROR_OTHER"
        return 0

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.delenv("HYDRAX_PIN_MEMORY", raising=False)

    def install(**results):
        driver = FakeDriver(**results)
        monkeypatch.setattr(pinning, "_driver", driver)
        return driver
    return install


def test_the_driver_sequence_registers_with_the_primary_context_pushed(fake):
    driver = fake()
    pinned = pin_host_memory(0x10000, 8192, device_ordinal=2)
    assert isinstance(pinned, PinnedRange) and (pinned.address, pinned.nbytes) == (0x10000, 8192)
    assert driver.calls == [("cuInit", 0), ("cuDeviceGet", 2), ("cuDevicePrimaryCtxRetain", 5), ("cuCtxPushCurrent", 0xC0DE),
                            ("cuMemHostRegister", 0x10000, 8192, pinning.CU_MEMHOSTREGISTER_PORTABLE), ("cuCtxPopCurrent",)]
    driver.calls.clear()
    pinned.release()
    pinned.release()
    assert pinned.released
    assert driver.calls == [("cuCtxPushCurrent", 0xC0DE), ("cuMemHostUnregister", 0x10000), ("cuCtxPopCurrent",),
                            ("cuDevicePrimaryCtxRelease", 5)]


def test_a_refused_registration_undoes_the_push_and_the_retain(fake, caplog):
    driver = fake(cuMemHostRegister=712)
    with caplog.at_level(logging.INFO, logger="hydrax.procs.pinning"):
        assert pin_host_memory(0x10000, 8192) is None
    assert driver.names()[-3:] == ["cuMemHostRegister", "cuCtxPopCurrent", "cuDevicePrimaryCtxRelease"]
    assert "cuMemHostRegister failed: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712)" in caplog.text


@pytest.mark.parametrize("step, undo", [("cuInit", []), ("cuDeviceGet", []), ("cuDevicePrimaryCtxRetain", []),
                                        ("cuCtxPushCurrent", ["cuDevicePrimaryCtxRelease"])])
def test_an_early_failure_undoes_exactly_what_was_done(fake, caplog, step, undo):
    driver = fake(**{step: 100})
    with caplog.at_level(logging.INFO, logger="hydrax.procs.pinning"):
        assert pin_host_memory(0x10000, 8192) is None
    assert driver.names()[driver.names().index(step) + 1:] == undo
    assert f"{step}" in caplog.text and "CUDA_ERROR_OTHER (100)" in caplog.text


def test_release_never_raises_when_the_driver_refuses(fake, caplog):
    driver = fake()
    pinned = pin_host_memory(0x10000, 8192)
    driver.results.update(cuMemHostUnregister=713, cuDevicePrimaryCtxRelease=1)
    with caplog.at_level(logging.INFO, logger="hydrax.procs.pinning"):
        pinned.release()
    assert "cuMemHostUnregister" in caplog.text and "cuDevicePrimaryCtxRelease failed" in caplog.text
    assert driver.names()[-2:] == ["cuCtxPopCurrent", "cuDevicePrimaryCtxRelease"]


gpu = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA driver and device")


@gpu
def test_pin_release_twice_and_pin_again(mapping, monkeypatch):
    monkeypatch.delenv("HYDRAX_PIN_MEMORY", raising=False)
    pinned = pin_host_memory(mapping.address, SIZE)
    assert pinned is not None and not pinned.released
    np.frombuffer(mapping, np.uint8)[:] = 9  # still ordinary, writable memory
    pinned.release()
    pinned.release()
    again = pin_host_memory(mapping.address, SIZE)
    assert again is not None
    again.release()


@gpu
def test_pinning_the_same_range_twice_is_refused(mapping, monkeypatch, caplog):
    monkeypatch.delenv("HYDRAX_PIN_MEMORY", raising=False)
    pinned = pin_host_memory(mapping.address, SIZE)
    assert pinned is not None
    try:
        with caplog.at_level(logging.INFO, logger="hydrax.procs.pinning"):
            assert pin_host_memory(mapping.address, SIZE) is None
        assert "cuMemHostRegister failed" in caplog.text
    finally:
        pinned.release()


def test_an_arena_without_a_gpu_stays_pageable_and_says_so():
    from hydrax.procs.arena import Arena

    arena = Arena(2, 1 << 20, 1)
    try:
        assert arena.pin() is cuda_driver_available()
        assert arena.pinned is cuda_driver_available()
    finally:
        arena.close()
