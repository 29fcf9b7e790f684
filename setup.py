"""Builds the `edgelet._core`, `edgelet._libc` and `edgelet._yaml` extensions (`_yaml` links the system
libyaml: Debian's libyaml-dev to build, libyaml-0-2 to run); a failed compile fails the build unless
EDGELET_NO_EXTENSIONS=1."""

import os

from setuptools import Extension, setup

if os.environ.get("EDGELET_NO_EXTENSIONS") == "1":
    ext_modules = []
else:
    from Cython.Build import cythonize

    ext_modules = cythonize(
        [
            "edgelet/_core.pyx",
            "edgelet/_libc.pyx",
            Extension("edgelet._yaml", ["edgelet/_yaml.pyx"], libraries=["yaml"]),
        ],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )

setup(ext_modules=ext_modules)
