"""The installed extension and the test suite's footing: ``_C`` exports its entry point alone,
refuses a torch it was not built against, and the suite collects where optional packages
are missing (the GPU machines have no PuLP)."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import hotswitch as hs
from hotswitch import _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Packages the suite uses where present and skips without.
needs_binutils = pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None,
                                    reason="needs nm and readelf (binutils)")
OPTIONAL = ("pulp", "scipy", "transformers", "safetensors", "tokenizers", "sentencepiece", "tensorboard",
            "matplotlib", "tqdm")


def _check(path):
    return subprocess.run([sys.executable, os.path.join(ROOT, "cmake", "check_extension.py"), path],
                          capture_output=True, text=True, timeout=120)


@needs_binutils
def test_the_extension_exports_its_entry_point_alone_and_loads_libstdcxx_shared():
    out = _check(_C.__file__)
    assert out.returncode == 0 and "exports PyInit__C alone, libstdc++ shared" in out.stdout, out.stdout + out.stderr


@needs_binutils
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("flags,needle", [
    ([], None),
    (["-static-libstdc++"], "does not load libstdc++.so"),
    (["-fvisibility=default"], "exports 2 symbols"),
])
def test_the_build_check_refuses_a_static_libstdcxx_and_extra_exports(tmp_path, flags, needle):
    # A module that formats a number through a stream, as the core's messages do.
    src = tmp_path / "m.cpp"
    src.write_text('#include <sstream>\n#include <string>\n'
                   'std::string twice(long x) { std::ostringstream os; os << x << x; return os.str(); }\n'
                   'extern "C" __attribute__((visibility("default"))) int PyInit__C() { return twice(7).size(); }\n')
    lib = tmp_path / "m.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-fvisibility=hidden", *flags, str(src), "-o", str(lib)],
                   check=True, timeout=120)
    out = _check(str(lib))
    if needle is None:
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        assert out.returncode == 1 and needle in out.stderr, out.stdout + out.stderr


def test_the_extension_names_the_torch_it_was_built_against():
    assert _C.TORCH_VERSION == torch.__version__


def test_an_extension_built_for_another_torch_is_refused_with_the_versions(tmp_path):
    # The same package, but the extension claims another torch: import must refuse it.
    code = ("import torch, sys, types\n"
            "import hotswitch._C as c\n"
            "c.TORCH_VERSION = '0.0.1'\n"
            "sys.modules.pop('hotswitch')\n"
            "try:\n"
            "    import hotswitch\n"
            "except ImportError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "built against torch 0.0.1" in out.stdout and torch.__version__ in out.stdout, out.stdout


def _without(tmp_path, names):
    """An environment in which importing any of ``names`` fails as a missing package does."""
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named {name!r}\", name={name!r})\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.mark.parametrize("marker", ["gpu", None])
def test_the_suite_collects_without_any_optional_package(tmp_path, marker):
    env = _without(tmp_path, OPTIONAL)
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/python"]
    out = subprocess.run(args + (["-m", marker] if marker else []), cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " collected" in out.stdout.splitlines()[-1], out.stdout[-500:]


def test_the_gpu_tests_run_without_pulp(tmp_path):
    # As on the GPU machines: no PuLP. Here the gpu tests skip for want of a device; they must
    # neither fail nor error for want of PuLP.
    env = _without(tmp_path, ["pulp"])
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                          "tests/python/planner", "tests/python/switch"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.splitlines()[-1], out.stdout[-1000:]
