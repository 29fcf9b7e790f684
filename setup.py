"""Builds the `edgelet._core` and `edgelet._libc` extensions; a failed compile fails the build unless EDGELET_NO_EXTENSIONS=1."""

import os

from setuptools import setup

if os.environ.get("EDGELET_NO_EXTENSIONS") == "1":
    ext_modules = []
else:
    from Cython.Build import cythonize

    ext_modules = cythonize(
        ["edgelet/_core.pyx", "edgelet/_libc.pyx"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )

setup(ext_modules=ext_modules)
