"""setup.py — builds accumplan._core for `pip install --no-build-isolation .`.

What it does: configures this repository's CMakeLists.txt in build/python-core/<interpreter>/ with
the planner only (no LibTorch, no tests) and ACCUMPLAN_WITH_PYTHON=ON, builds the one target
accumplan_python_core (python/core/core.cpp over the C++ planner) with the interpreter that runs
pip, and copies the module into the package. A second install reuses that folder (ninja builds
only what changed). Needs cmake, ninja (or make), a C++17 compiler, nlohmann/json and pybind11
(Debian: pybind11-dev; or the pip package pybind11, whose CMake files are used when importable).
What it is not: the C++ tool's build (CMakeLists.txt, scripts/build.sh) or its install.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tag = sysconfig.get_config_var("SOABI") or "python%d.%d" % sys.version_info[:2]
        build_dir = os.path.join(ROOT, "build", "python-core", tag)
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
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build_dir, "--target", "accumplan_python_core", "-j",
                        os.environ.get("JOBS", "2")], check=True)
        built = os.path.join(build_dir, "python", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


setup(ext_modules=[CMakeExtension("accumplan._core")], cmdclass={"build_ext": CMakeBuild})
