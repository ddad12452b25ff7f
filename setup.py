"""Builds the hotswitch Python package; its native extension hotswitch._C comes from the CMake
build (CMakeLists.txt, target _C), which this file drives rather than compiling anything itself.

    script/build                               # this checkout: CMake, then an editable install
    pip install .                              # a fresh environment: torch comes with it
    pip install --no-build-isolation .         # an environment that has its torch already

With build isolation pip builds against the torch it installs for the build (the newest that
pyproject.toml admits), which is the torch it then installs into a fresh environment; into an
environment that already has another torch, build without isolation, against that torch
(``import hotswitch`` refuses an extension built against another torch).

The CMake build folder is build/cmake, or $HOTSWITCH_BUILD_DIR. A folder already configured
(script/build configures it with the tests and benchmarks) is only built, so an install after
script/build compiles nothing again; an unconfigured one is configured for the extension alone.
$HOTSWITCH_JOBS bounds the build's parallelism. The torch the extension is built against is the
one the Python running this file imports.
"""

import filecmp
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cache_entry(cache: str, key: str) -> str:
    """The value of ``key`` in a CMakeCache.txt, '' when absent."""
    with open(cache) as f:
        for line in f:
            name, _, value = line.rstrip("\n").partition("=")
            if name.split(":")[0] == key:
                return value
    return ""


def _same_python(configured: str) -> bool:
    """Whether a build folder's Python3_EXECUTABLE is the Python running this file (a virtual
    environment's python is a link to its base Python: compare the paths, not their targets)."""
    return os.path.abspath(configured) == os.path.abspath(sys.executable)


class CMakeBuild(build_ext):
    """Builds each extension as the CMake target of its last name part (hotswitch._C -> _C)."""

    def build_extension(self, ext):
        build_dir = os.environ.get("HOTSWITCH_BUILD_DIR")
        if build_dir is None:
            # script/build's folder when it was configured for this Python; otherwise one of
            # this Python's own (pip's isolated build environment is another Python each time).
            build_dir = os.path.join(ROOT, "build", "cmake")
            cache = os.path.join(build_dir, "CMakeCache.txt")
            if not os.path.exists(cache) or not _same_python(_cache_entry(cache, "Python3_EXECUTABLE")):
                tag = hashlib.sha1(os.path.abspath(sys.executable).encode()).hexdigest()[:10]
                build_dir = os.path.join(ROOT, "build", f"pip-{tag}")
        build_dir = os.path.abspath(build_dir)
        target = ext.name.rpartition(".")[2]
        cache = os.path.join(build_dir, "CMakeCache.txt")
        if os.path.exists(cache):
            configured = _cache_entry(cache, "Python3_EXECUTABLE")
            if not _same_python(configured):
                raise RuntimeError(f"{build_dir} is configured for Python {configured!r}, not {sys.executable!r}; "
                                   "set HOTSWITCH_BUILD_DIR to another folder or remove it")
        else:
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPython3_EXECUTABLE={sys.executable}",
                                   "-DHOTSWITCH_BUILD_TESTS=OFF", "-DHOTSWITCH_BUILD_BENCHMARKS=OFF",
                                   "-DHOTSWITCH_BUILD_FUZZERS=OFF"])
        command = ["cmake", "--build", build_dir, "--target", target]
        if os.environ.get("HOTSWITCH_JOBS"):
            command += ["-j", os.environ["HOTSWITCH_JOBS"]]
        subprocess.check_call(command)

        # The CMake build asked this same Python for the suffix.
        built = os.path.join(_cache_entry(cache, "HOTSWITCH_EXTENSION_DIR"), target + sysconfig.get_config_var("EXT_SUFFIX"))
        dest = self.get_ext_fullpath(ext.name)
        if not os.path.exists(built):
            raise RuntimeError(f"the CMake build did not write {built}")
        if os.path.realpath(built) != os.path.realpath(dest):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(built, dest)

    def copy_extensions_to_source(self):
        # The CMake build already wrote the extension into the package folder: copying the same
        # bytes back would rewrite, in place, a module that running processes may have loaded.
        for ext in self.extensions:
            self.inplace = 0
            built = self.get_ext_fullpath(ext.name)
            self.inplace = 1
            in_place = self.get_ext_fullpath(ext.name)
            if not (os.path.exists(in_place) and filecmp.cmp(built, in_place, shallow=False)):
                self.copy_file(built, in_place, level=self.verbose)


# The package's metadata and dependencies are in pyproject.toml.
setup(
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[Extension("hotswitch._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
