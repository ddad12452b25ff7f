"""Prints, one `key=value` a line, what the CMake build needs to know about the Python it builds
the extension for and that Python's torch (read by cmake/TorchPython.cmake)."""

import os
import sysconfig

import torch

root = os.path.dirname(os.path.abspath(torch.__file__))
print(f"version={torch.__version__}")
print(f"cuda={torch.version.cuda or ''}")
print(f"include_dir={os.path.join(root, 'include')}")
print(f"api_include_dir={os.path.join(root, 'include', 'torch', 'csrc', 'api', 'include')}")
print(f"lib_dir={os.path.join(root, 'lib')}")
print(f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print(f"ext_suffix={sysconfig.get_config_var('EXT_SUFFIX')}")
# pybind11 keys its shared type registry by these; the extension must use torch's, or the
# ProcessGroup handed to C10dTransport does not convert.
for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    print(f"pybind11_{name.lower()}={getattr(torch._C, f'_PYBIND11_{name}', None) or ''}")
# The libstdc++ that torch's process runs with: the extension links that very library, so that
# it carries no copy of libstdc++ of its own (see CMakeLists.txt).
libstdcxx = ""
try:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libstdc++.so"):
                libstdcxx = path
                break
except OSError:
    pass
print(f"libstdcxx={libstdcxx}")
