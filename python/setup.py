# python/setup.py: builds the kiln._kiln C extension against the kiln in this repository's build tree (KILN_BUILD_DIR) or an installed one (pkg-config).
"""Where kiln comes from, in this order:

1. KILN_BUILD_DIR: a meson build folder of this repository (meson setup build &&
   ninja -C build). Headers come from its source tree, libkiln.so and
   libkiln-nn.so from the folder itself, and the extension records that folder
   as its run path, so nothing needs installing.
2. pkg-config: an installed kiln (meson install), found through kiln-nn.pc (or
   kiln.pc alone: the package is then built without kiln.nn). PKG_CONFIG_PATH
   points at a prefix of your own.
3. The repository's own build/ folder (the quick start's), when it exists.

KILN_PY_NO_NN=1 leaves kiln.nn out even where libkiln-nn exists.
"""
import json
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["src/module.c", "src/device.c", "src/tensor.c", "src/convert.c", "src/ops.c", "src/dlpack.c", "src/methods.c", "src/indexing.c", "src/autograd.c"]
NN_SOURCES = ["src/nn_data.c", "src/nn_train.c", "src/nn_model.c"]


def fail(message):
    sys.stderr.write("kiln: " + message + "\n")
    sys.exit(1)


def from_build_dir(build_dir):
    build_dir = os.path.abspath(build_dir)
    info_path = os.path.join(build_dir, "meson-info", "meson-info.json")
    if not os.path.exists(info_path):
        fail(f"KILN_BUILD_DIR={build_dir} is not a meson build folder (no meson-info/meson-info.json); "
             "configure one with: meson setup build && ninja -C build")
    with open(info_path) as f:
        source_dir = json.load(f)["directories"]["source"]
    lib = os.path.join(build_dir, "libkiln.so")
    if not os.path.exists(lib):
        fail(f"{lib} does not exist: build kiln first (ninja -C {build_dir})")
    nn_dir = os.path.join(build_dir, "nn")
    has_nn = os.path.exists(os.path.join(nn_dir, "libkiln-nn.so"))
    include_dirs = [os.path.join(source_dir, "include")]
    library_dirs = [build_dir]
    libraries = ["kiln"]
    if has_nn:
        include_dirs.append(os.path.join(source_dir, "nn", "include"))
        library_dirs.append(nn_dir)
        libraries.insert(0, "kiln-nn")
    return dict(include_dirs=include_dirs, library_dirs=library_dirs, libraries=libraries,
                runtime_library_dirs=list(library_dirs), extra_compile_args=[], extra_link_args=[]), has_nn


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def from_pkg_config():
    has_nn = pkg_config("--exists", "kiln-nn") is not None
    package = "kiln-nn" if has_nn else "kiln"
    cflags = pkg_config("--cflags", package)
    libs = pkg_config("--libs", package)
    if cflags is None or libs is None:
        return None, False
    cfg = dict(include_dirs=[f[2:] for f in cflags if f.startswith("-I")],
               library_dirs=[f[2:] for f in libs if f.startswith("-L")],
               libraries=[f[2:] for f in libs if f.startswith("-l")],
               extra_compile_args=[f for f in cflags if not f.startswith("-I")],
               extra_link_args=[f for f in libs if not f.startswith(("-L", "-l"))],
               runtime_library_dirs=[])
    libdir = pkg_config("--variable=libdir", "kiln")
    if libdir and libdir[0] not in ("/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/lib"):
        cfg["runtime_library_dirs"].append(libdir[0])
    return cfg, has_nn


def kiln_config():
    build_dir = os.environ.get("KILN_BUILD_DIR")
    if build_dir:
        cfg, has_nn = from_build_dir(build_dir)
        where = f"the build folder {build_dir}"
    else:
        cfg, has_nn = from_pkg_config()
        where = "pkg-config"
        if cfg is None:
            default = os.path.join(os.path.dirname(HERE), "build")
            if os.path.exists(os.path.join(default, "meson-info")):
                cfg, has_nn = from_build_dir(default)
                where = f"the build folder {default}"
            else:
                fail("cannot find kiln: set KILN_BUILD_DIR to a meson build folder of kiln "
                     "(KILN_BUILD_DIR=$PWD/build pip install ./python), or install kiln (meson install) "
                     "and let pkg-config find kiln.pc (PKG_CONFIG_PATH=<prefix>/lib/x86_64-linux-gnu/pkgconfig)")
    if os.environ.get("KILN_PY_NO_NN") == "1":
        has_nn = False
    sys.stderr.write(f"kiln: building against {where}" + ("" if has_nn else ", without kiln.nn (no libkiln-nn)")
                     + "\n")
    return cfg, has_nn


def check_wheel_support():
    """pip builds a wheel; setuptools before 70.1 needs the wheel package for that, which --no-build-isolation
    does not fetch (the failure would read "invalid command 'bdist_wheel'")."""
    if not any(arg.startswith("bdist_wheel") for arg in sys.argv[1:]):
        return
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1 has its own)
        return
    except ImportError:
        pass
    try:
        import wheel  # noqa: F401
    except ImportError:
        fail(f"{sys.executable} has no 'wheel' package, which building with --no-build-isolation needs: install it "
             "(Debian: apt install python3-wheel; a venv: python -m pip install wheel), or drop --no-build-isolation "
             "where pip can reach the network")


def extension():
    cfg, has_nn = kiln_config()
    sources = SOURCES + (NN_SOURCES if has_nn else [])
    macros = [] if has_nn else [("KILNPY_NO_NN", "1")]
    return Extension("kiln._kiln", sources=sources, define_macros=macros,
                     include_dirs=cfg["include_dirs"] + ["src"], library_dirs=cfg["library_dirs"],
                     libraries=cfg["libraries"], runtime_library_dirs=cfg["runtime_library_dirs"],
                     extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                         "-Wno-missing-field-initializers"] + cfg["extra_compile_args"],
                     extra_link_args=cfg["extra_link_args"])


check_wheel_support()
setup(packages=["kiln", "kiln.nn"], ext_modules=[extension()])
