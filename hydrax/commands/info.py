"""``hydrax info``: versions, the JAX backend, how loader workers would start, and GPU pinning."""

from __future__ import annotations

import argparse
import os
import platform


def register(commands) -> None:
    parser = commands.add_parser("info", help="show versions, the JAX backend and how workers would start",
                                 description=__doc__, epilog="example: hydrax info")
    parser.set_defaults(run=run)


def run(_args: argparse.Namespace) -> int:
    import numpy

    from .. import __version__
    from ..procs.processes import start_method

    before_jax = start_method()
    print(f"hydrax {__version__} (Python {platform.python_version()}, numpy {numpy.__version__})")
    try:
        import jax

        print(f"jax {jax.__version__}: default backend {jax.default_backend()}, devices {jax.devices()}")
    except Exception as exc:  # a broken JAX install should still let the rest print
        print(f"jax unavailable: {exc}")
    print(f"cpu cores available: {len(os.sched_getaffinity(0))}")
    forced = os.environ.get("HYDRAX_START_METHOD")
    print(f"workers start by: {before_jax} before JAX initialises, {start_method()} after" + (f" (forced by HYDRAX_START_METHOD={forced})" if forced else ""))
    print(f"shared memory: memfd ({'supported' if hasattr(os, 'memfd_create') else 'NOT supported'})")
    from ..procs.pinning import cuda_driver_available

    pinning = "off (HYDRAX_PIN_MEMORY=0)" if os.environ.get("HYDRAX_PIN_MEMORY") == "0" else (
        "available (CUDA driver found)" if cuda_driver_available() else "not available (no CUDA driver or device)")
    print(f"page-locked slots for GPU transfers: {pinning}")
    return 0
