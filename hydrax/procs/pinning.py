"""Page-locking host memory with the CUDA driver, so that transfers to a GPU read it directly.

A host-to-device copy from ordinary (pageable) memory cannot be handed to the GPU's DMA engine as
is: the pages may move or be swapped out mid-transfer, so the driver copies the data through a
page-locked bounce buffer of its own, chunk by chunk. Memory registered with
``cuMemHostRegister`` stays resident at fixed physical addresses, and the driver recognises it
and lets the device read it in place, which is how ``jax.device_put`` of views into the arena
gets close to the link's bandwidth.

The arena is registered once per run, in the process that owns the CUDA context; registration
costs about as much as touching every page, so it is not something to repeat per batch. Two
rules hold for a :class:`PinnedRange`: release it before the memory is unmapped (the driver
would otherwise keep the pages locked, and a later mapping at the same address could not be
registered), and release it only when no transfer from it can still be in flight.

Everything goes through ``libcuda.so.1`` with ctypes: the driver library is present wherever a
GPU driver is, whichever CUDA runtime (if any) JAX brought along. Any environmental failure
(no driver, no device, the range already registered, not enough lockable memory) leaves nothing
behind and returns None, so callers simply keep using pageable memory.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

logger = logging.getLogger("hydrax.procs.pinning")

#: Pinned for every CUDA context in the process, not only the one current at registration, so
#: the range also counts as pinned for a context XLA might create after us.
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CUDA_SUCCESS = 0
_LIBRARY = "libcuda.so.1"


class _Driver:
    """The few driver entry points used here, with prototypes, resolved once per process."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        c_int, c_uint, c_void_p, c_size_t = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t
        P = ctypes.POINTER

        def bind(names: tuple[str, ...], argtypes: list, optional: bool = False):
            # cuda.h maps the plain names to these versioned symbols; the plain ones are kept by
            # the driver for old binaries and may have older semantics, so the versioned ones go first.
            for name in names:
                function = getattr(lib, name, None)
                if function is not None:
                    function.argtypes = argtypes
                    function.restype = c_int
                    return function
            if optional:
                return None
            raise OSError(f"{_LIBRARY} has no {names[0]}")

        self.cuInit = bind(("cuInit",), [c_uint])
        self.cuDeviceGetCount = bind(("cuDeviceGetCount",), [P(c_int)])
        self.cuDeviceGet = bind(("cuDeviceGet",), [P(c_int), c_int])
        self.cuDevicePrimaryCtxRetain = bind(("cuDevicePrimaryCtxRetain",), [P(c_void_p), c_int])
        self.cuDevicePrimaryCtxRelease = bind(("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), [c_int])
        self.cuCtxPushCurrent = bind(("cuCtxPushCurrent_v2",), [c_void_p])
        self.cuCtxPopCurrent = bind(("cuCtxPopCurrent_v2",), [P(c_void_p)])
        self.cuMemHostRegister = bind(("cuMemHostRegister_v2",), [c_void_p, c_size_t, c_uint])
        self.cuMemHostUnregister = bind(("cuMemHostUnregister",), [c_void_p])
        self.cuGetErrorName = bind(("cuGetErrorName",), [c_int, P(ctypes.c_char_p)], optional=True)

    def describe(self, result: int) -> str:
        """``CUDA_ERROR_NAME (code)``, or just the code when the driver cannot name it."""
        if self.cuGetErrorName is not None:
            name = ctypes.c_char_p()
            if self.cuGetErrorName(result, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
                return f"{name.value.decode(errors='replace')} ({result})"
        return f"CUresult {result}"


_driver_lock = threading.Lock()
_driver: _Driver | None = None
_driver_error: str | None = None


def _load_driver() -> _Driver | None:
    """The process's driver binding, or None (and the reason in ``_driver_error``) without a driver."""
    global _driver, _driver_error
    with _driver_lock:
        if _driver is None and _driver_error is None:
            try:
                _driver = _Driver(ctypes.CDLL(_LIBRARY))
            except OSError as e:
                _driver_error = str(e)
        return _driver


def _init(driver: _Driver) -> int:
    # Not cached: cuInit is cheap once done, and a result cached before a fork would be wrong
    # in the child, where the driver refuses to work.
    return driver.cuInit(0)


def cuda_driver_available() -> bool:
    """True when the CUDA driver library loads, initialises, and reports at least one device."""
    driver = _load_driver()
    if driver is None or _init(driver) != CUDA_SUCCESS:
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) == CUDA_SUCCESS and count.value > 0


class PinnedRange:
    """A host address range registered (page-locked) with the CUDA driver.

    It holds a retain on the device's primary context, so the context outlives the registration
    even if everything else lets go of it. Call :meth:`release` before the memory is unmapped,
    and only when no transfer from the range can still be running.
    """

    def __init__(self, driver: _Driver, address: int, nbytes: int, device: int, context: int) -> None:
        self.address = address
        self.nbytes = nbytes
        self._driver = driver
        self._device = device
        self._context = context
        self._lock = threading.Lock()
        self._released = False

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has run."""
        return self._released

    def release(self) -> None:
        """Unregister the range and drop the primary-context retain. Idempotent; never raises."""
        with self._lock:
            if self._released:
                return
            self._released = True
        driver = self._driver
        # Unregistering needs a current context; pushing the primary one (rather than relying on
        # whatever this thread has current) makes release work from any thread.
        result = driver.cuCtxPushCurrent(ctypes.c_void_p(self._context))
        if result == CUDA_SUCCESS:
            result = driver.cuMemHostUnregister(ctypes.c_void_p(self.address))
            if result != CUDA_SUCCESS:
                logger.info("cuMemHostUnregister of %d bytes at %#x failed: %s", self.nbytes, self.address, driver.describe(result))
            _pop(driver)
        else:
            logger.info("cannot unregister %d bytes at %#x: cuCtxPushCurrent failed: %s", self.nbytes, self.address, driver.describe(result))
        result = driver.cuDevicePrimaryCtxRelease(self._device)
        if result != CUDA_SUCCESS:
            logger.info("cuDevicePrimaryCtxRelease failed: %s", driver.describe(result))

    def __repr__(self) -> str:
        state = "released" if self._released else "pinned"
        return f"PinnedRange(address={self.address:#x}, nbytes={self.nbytes}, device={self._device}, {state})"


def _pop(driver: _Driver) -> bool:
    popped = ctypes.c_void_p()
    result = driver.cuCtxPopCurrent(ctypes.byref(popped))
    if result != CUDA_SUCCESS:
        logger.info("cuCtxPopCurrent failed: %s", driver.describe(result))
    return result == CUDA_SUCCESS


def pin_host_memory(address: int, nbytes: int, device_ordinal: int = 0) -> PinnedRange | None:
    """Page-lock ``nbytes`` of host memory at ``address`` for transfers to CUDA device ``device_ordinal``.

    The registration is portable (it counts for every CUDA context in the process) and is made
    with the device's primary context, the one XLA uses; call this after JAX has set up its GPU
    backend so that the context already carries XLA's flags. Returns None, having undone any
    partial work, when pinning is not possible here (no CUDA driver or device, the range is
    already registered, too little lockable memory) or when the environment variable
    ``HYDRAX_PIN_MEMORY`` is ``0``; the reason is logged on the ``hydrax.procs.pinning`` logger.

    :raises ValueError: for a zero address, a non-positive size or a negative device ordinal.
    """
    address, nbytes, device_ordinal = int(address), int(nbytes), int(device_ordinal)
    if address == 0:
        raise ValueError("cannot pin memory at address 0")
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    if device_ordinal < 0:
        raise ValueError(f"device_ordinal must not be negative, got {device_ordinal}")
    if os.environ.get("HYDRAX_PIN_MEMORY", "").strip() == "0":
        logger.debug("not pinning host memory: HYDRAX_PIN_MEMORY=0")
        return None
    driver = _load_driver()
    if driver is None:
        logger.debug("not pinning host memory: no CUDA driver (%s)", _driver_error)
        return None

    def fail(step: str, result: int) -> None:
        logger.info("not pinning %d bytes at %#x: %s failed: %s", nbytes, address, step, driver.describe(result))

    result = _init(driver)
    if result != CUDA_SUCCESS:
        fail("cuInit", result)
        return None
    device = ctypes.c_int()
    result = driver.cuDeviceGet(ctypes.byref(device), device_ordinal)
    if result != CUDA_SUCCESS:
        fail(f"cuDeviceGet({device_ordinal})", result)
        return None
    context = ctypes.c_void_p()
    result = driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device.value)
    if result != CUDA_SUCCESS:
        fail("cuDevicePrimaryCtxRetain", result)
        return None
    result = driver.cuCtxPushCurrent(context)
    if result != CUDA_SUCCESS:
        fail("cuCtxPushCurrent", result)
        driver.cuDevicePrimaryCtxRelease(device.value)
        return None
    result = driver.cuMemHostRegister(ctypes.c_void_p(address), nbytes, CU_MEMHOSTREGISTER_PORTABLE)
    registered = result == CUDA_SUCCESS
    if not registered:
        fail("cuMemHostRegister", result)
    # Should the pop fail, the primary context merely stays current on this thread: XLA sets
    # its context current itself before each use, and the registration is valid either way.
    _pop(driver)
    if not registered:
        driver.cuDevicePrimaryCtxRelease(device.value)
        return None
    logger.debug("pinned %d bytes at %#x for CUDA device %d", nbytes, address, device_ordinal)
    return PinnedRange(driver, address, nbytes, device.value, context.value or 0)
