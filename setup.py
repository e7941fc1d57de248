"""Builds the Cython extension ``hydrax._core``; everything else lives in pyproject.toml."""

import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Lists each extension's ``depends`` (the C header ``hydrax/_simd.h``) among its sources, so the
    sdist ships them: setuptools does so itself only from 68.1 (pypa/setuptools#4000)."""

    def get_source_files(self):
        files = super().get_source_files()
        # only the project's own files (cythonize may add a cimported package's from elsewhere)
        ours = [name for ext in self.extensions for name in ext.depends if not os.path.isabs(name) and os.path.isfile(name)]
        return files + [name for name in ours if name not in files]


extensions = [
    Extension(
        "hydrax._core",
        # _core.pyx includes the _*.pxi files next to it; cythonize finds them there and
        # recompiles when one changes, so they are not sources of their own.
        ["hydrax/_core.pyx"],
        # the C headers the .pxi files include: SIMD kernels, the plane kernels, the libjpeg binding
        depends=["hydrax/_simd.h", "hydrax/_planar.h", "hydrax/_libjpeg.h"],
        include_dirs=[numpy.get_include()],
        extra_compile_args=["-O3"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # dlopen, for the libjpeg-turbo Pillow brings (in libc itself from glibc 2.34)
        libraries=["dl"] if sys.platform.startswith("linux") else [],
    )
]

setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
        },
    )
)
