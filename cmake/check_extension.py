"""Checks a built hotswitch._C (run by the build after linking it; exit 1 fails the build):

- it exports its entry point PyInit__C and nothing else;
- it loads libstdc++ as a shared library and carries none of libstdc++'s compiled code.

The second guards against a toolchain that links libstdc++ statically (a GCC installed without
its shared libstdc++ beside it): the extension then holds a second copy of libstdc++'s locale
machinery beside the process's, and formatting a number in one with a stream made by the other
crashes (std::ostream::operator<<(long) reading a facet of the other copy's locale).

    python cmake/check_extension.py PATH_TO_C.so
"""

import re
import shutil
import subprocess
import sys

# Code compiled into libstdc++ itself, never instantiated from its headers in user code.
LIBSTDCXX_OWN = re.compile(r"^std::(locale::|ios_base::|codecvt<|__cxx11::numpunct<|numpunct<|ctype<char>::)")


def lines(*command):
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()


def main(path: str) -> int:
    nm, readelf = shutil.which("nm"), shutil.which("readelf")
    if nm is None or readelf is None:
        print(f"check_extension: no nm/readelf here; {path} not checked")
        return 0
    exported = [line.split()[-1] for line in lines(nm, "-D", "--defined-only", path) if line.strip()]
    errors = []
    if exported != ["PyInit__C"]:
        errors.append(f"it exports {len(exported)} symbols, expected PyInit__C alone: {exported[:10]}")
    needed = [line for line in lines(readelf, "-d", path) if "(NEEDED)" in line]
    if not any("libstdc++.so" in line for line in needed):
        errors.append("it does not load libstdc++.so: the compiler linked libstdc++ statically")
    symbols = [line.split(None, 2) for line in lines(nm, "-C", "--defined-only", path)]
    own = [s[2] for s in symbols if len(s) == 3 and s[1] in "TtWwDdBbRrVvu" and LIBSTDCXX_OWN.match(s[2])]
    if own:
        errors.append(f"it carries {len(own)} of libstdc++'s own symbols (a static libstdc++), e.g. {own[0]}")
    if errors:
        print(f"check_extension: {path}:\n  " + "\n  ".join(errors) + "\n  Build with a compiler whose shared "
              "libstdc++ is found (g++ -print-file-name=libstdc++.so prints a full path), e.g. the system's g++.",
              file=sys.stderr)
        return 1
    print(f"check_extension: {path}: exports PyInit__C alone, libstdc++ shared")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_extension.py PATH_TO_C.so")
    sys.exit(main(sys.argv[1]))
