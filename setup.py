"""setup.py — builds accumplan._core for `pip install --no-build-isolation .`.

What it does: configures this repository's CMakeLists.txt in build-python-<interpreter>/ with
the planner only (no LibTorch, no tests) and ACCUMPLAN_WITH_PYTHON=ON, builds accumplan._core
(python/core/core.cpp: the C++ planner and measurement search) and, when the interpreter that runs
pip imports torch, accumplan._probes (python/core/probes.cpp: the cpu-counting probe, against that
torch's own headers, libc10 and C++ ABI), and copies the modules into the package. A second install reuses that folder (ninja builds
only what changed). Needs cmake, ninja (or make), a C++17 compiler, nlohmann/json and pybind11
(Debian: pybind11-dev; or the pip package pybind11, whose CMake files are used when importable).
What it is not: the C++ tool's build (CMakeLists.txt, scripts/build.sh) or its install.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _say(line):
    """One line per stage on stderr (pip shows it with -v; the build takes minutes)."""
    print("accumplan: " + line, file=sys.stderr, flush=True)


def _check_interpreter():
    """A venv made from a python3 that cannot see the system's packages (pyenv's, first on PATH)
    has no `wheel`: pip would stop with "invalid command 'bdist_wheel'" and no hint. Say which
    interpreter to use instead, in one line."""
    try:
        import wheel  # noqa: F401
        return
    except ImportError:
        pass
    try:
        from setuptools.command import bdist_wheel  # noqa: F401 - setuptools >= 70.1 has its own
    except ImportError:
        sys.exit("accumplan: %s has no 'wheel' package (pip install --no-build-isolation uses this interpreter's "
                 "own); install it there (python -m pip install wheel), or use the interpreter that has your torch "
                 "and wheel" % sys.executable)


_check_interpreter()


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _torch_args():
    """CMake arguments naming Python's torch (headers, libc10, C++ ABI), or [] without torch."""
    try:
        import torch
        from torch.utils import cpp_extension
        include = cpp_extension.include_paths()[0]
    except Exception as e:  # noqa: BLE001 - a broken torch must not stop the planner's install
        _say("%s cannot import torch (%s): accumplan._probes is not built, so plans can be read but not made "
             "or trained on the CPU; install with the interpreter that imports torch"
             % (sys.executable, e))
        return []
    if not os.path.exists(os.path.join(include, "c10", "core", "Allocator.h")):
        # Debian's python3-torch links its headers from libtorch-dev, which it does not depend on.
        print("accumplan: torch's C++ headers are missing (%s): accumplan._probes is not built; install "
              "libtorch-dev (Debian) and reinstall for accumplan.plan" % include, file=sys.stderr)
        return []
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    # The top folder holds c10/, the API folder torch/version.h.
    return ["-DACCUMPLAN_PYTHON_TORCH_INCLUDE=" + ";".join(cpp_extension.include_paths()[:2]),
            "-DACCUMPLAN_PYTHON_TORCH_LIB=" + os.path.join(os.path.dirname(torch.__file__), "lib"),
            "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tag = sysconfig.get_config_var("SOABI") or "python%d.%d" % sys.version_info[:2]
        # Beside build/, one level under the clone like it: the planner's objects then compile with
        # the same relative paths and flags as the C++ build's, and ccache (CCACHE_BASEDIR set to
        # the clone, as scripts/test.sh does) reuses them instead of compiling the planner again.
        build_dir = os.path.join(ROOT, "build-python-" + tag)
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DACCUMPLAN_WITH_TORCH=OFF",
                "-DACCUMPLAN_WITH_CUPTI=OFF", "-DACCUMPLAN_BUILD_TESTS=OFF", "-DACCUMPLAN_WITH_PYTHON=ON",
                "-DPython_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            args += ["-G", "Ninja"]
        try:
            import pybind11
            args.append("-Dpybind11_DIR=" + pybind11.get_cmake_dir())
        except ImportError:
            pass  # CMake finds a system pybind11 (Debian's pybind11-dev) by itself
        torch_args = _torch_args()
        # More CMake arguments, e.g. where header-only packages are on a machine without them
        # (scripts/gpu-check.sh: -DCMAKE_PREFIX_PATH=.gpu-deps).
        extra = os.environ.get("ACCUMPLAN_CMAKE_ARGS", "").split()
        _say("configuring the compiled core with CMake in %s" % build_dir)
        subprocess.run(args + torch_args + extra, check=True, stdout=subprocess.DEVNULL)
        targets = ["accumplan_python_core"] + (["accumplan_python_probes"] if torch_args else [])
        _say("building %s (about 2-3 minutes on 2 cores from scratch; ninja rebuilds only what changed)"
             % " and ".join(t.replace("accumplan_python_", "_") for t in targets))
        subprocess.run(["cmake", "--build", build_dir, "--target"] + targets + ["-j", os.environ.get("JOBS", "2")],
                       check=True)
        core = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(core), exist_ok=True)
        for name in ("_core", "_probes") if torch_args else ("_core",):
            built = os.path.join(build_dir, "python", name + sysconfig.get_config_var("EXT_SUFFIX"))
            shutil.copyfile(built, os.path.join(os.path.dirname(core), os.path.basename(built)))
        _say("built; installing the package")


# setuptools copies python/accumplan into its build folder and never removes a file from there: a
# module deleted or renamed in the sources (plan.py became plans.py) would be installed again from
# an earlier build. The folder is ours (setup.cfg), so it starts empty each time.
for _old in glob.glob(os.path.join(ROOT, "build", "python-setuptools", "lib*", "accumplan")):
    shutil.rmtree(_old)

setup(ext_modules=[CMakeExtension("accumplan._core")], cmdclass={"build_ext": CMakeBuild})
