"""Build fastcollate._C with torch.utils.cpp_extension (ninja).

Switches are read once, here, and the decision is printed:
  FASTCOLLATE_NO_CUDA=1     never build the CUDA kernels
  FASTCOLLATE_FORCE_CUDA=1  build them even when torch reports no GPU (needs a CUDA torch + nvcc)
  MAX_JOBS, TORCH_CUDA_ARCH_LIST are honoured by torch's BuildExtension itself.
  FASTCOLLATE_DEBUG=1       -O0 -g; otherwise -O3, and -g0 for the C++ compiler (see cxx_flags)
Install with: pip install --no-build-isolation -e .
Package with: python -m build --no-isolation  (an sdist, and a wheel built from it)
Beside the module, the build writes the record of the torch it was built against
(fastcollate/_C.build.json, see fastcollate/_buildinfo.py), which fastcollate checks at import.

What it does is said on stderr and in build/fastcollate-build.log (pip shows a successful build's
output only with -v): the decision, each file as ninja finishes it, the time. An editable install
keeps its objects in build/editable-* (setuptools would compile into a new temporary folder every
time), so installing again with unchanged sources compiles nothing.
"""
import contextlib
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import threading
import time

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
except ImportError as exc:  # torch is deliberately not a build requirement (it would pull a CUDA build)
    raise SystemExit(
        "fastcollate: torch must be installed before building; "
        "use `pip install --no-build-isolation -e .`"
    ) from exc

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_buildinfo():
    # by path: importing the package would import torch's extension (this very build's output)
    spec = importlib.util.spec_from_file_location("_fastcollate_buildinfo", os.path.join(HERE, "fastcollate", "_buildinfo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


buildinfo = _load_buildinfo()


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


NO_CUDA = _flag("FASTCOLLATE_NO_CUDA")
FORCE_CUDA = _flag("FASTCOLLATE_FORCE_CUDA")
DEBUG = _flag("FASTCOLLATE_DEBUG")
# csrc/engine (ATen, GIL-free), csrc/python (GIL held), csrc/bindings (the module): always built;
# csrc/cuda only with CUDA.
CPP_SOURCES = sorted(p for p in glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True)
                     if not p.startswith(os.path.join("csrc", "cuda", "")))
CU_SOURCES = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
CUDA_CPP_SOURCES = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cpp")))  # torch-side wrappers of the kernels
NO_JPEG = _flag("FASTCOLLATE_NO_JPEG")


def _jpeg_decision():
    """(include dirs, library dirs, why) for libjpeg(-turbo), or None and why not: pkg-config's
    answer, else jpeglib.h and libjpeg.so in the standard places. Without it the build still
    succeeds; fastcollate.images then decodes with Pillow and says how to get the compiled stage."""
    if NO_JPEG:
        return None, "FASTCOLLATE_NO_JPEG is set"
    import subprocess

    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "libjpeg"], capture_output=True, text=True,
                             timeout=30)
        if out.returncode == 0:
            flags = out.stdout.split()
            incs = [f[2:] for f in flags if f.startswith("-I")]
            libs = [f[2:] for f in flags if f.startswith("-L")]
            if any(os.path.exists(os.path.join(d, "jpeglib.h")) for d in incs + ["/usr/include", "/usr/local/include"]):
                return (incs, libs), "libjpeg found by pkg-config"
    except (OSError, subprocess.SubprocessError):
        pass
    for prefix in ("/usr", "/usr/local", "/opt/homebrew", "/opt/libjpeg-turbo"):
        inc = os.path.join(prefix, "include")
        if os.path.exists(os.path.join(inc, "jpeglib.h")):
            libdirs = [d for d in glob.glob(os.path.join(prefix, "lib*")) + glob.glob(os.path.join(prefix, "lib", "*-linux-gnu"))
                       if glob.glob(os.path.join(d, "libjpeg.so*")) or glob.glob(os.path.join(d, "libjpeg.dylib"))]
            if libdirs:
                return ([inc], libdirs[:1]), f"jpeglib.h in {inc}"
    return None, ("libjpeg not found (no pkg-config libjpeg, no jpeglib.h); install libjpeg-turbo's headers "
                  "(Debian/Ubuntu: apt-get install libjpeg62-turbo-dev or libjpeg-turbo8-dev) and build again")


def _cuda_decision():
    if NO_CUDA:
        return False, "FASTCOLLATE_NO_CUDA is set"
    if not CU_SOURCES:
        return False, "no CUDA sources in csrc/cuda"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU build"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None and shutil.which("nvcc") is None:
        return False, "nvcc not found (set CUDA_HOME)"
    if torch.cuda.is_available():
        return True, "torch has CUDA and a GPU is visible"
    if FORCE_CUDA:
        return True, "FASTCOLLATE_FORCE_CUDA is set"
    return True, "torch has CUDA and nvcc is present (no GPU visible; kernels built anyway)"


DEFAULT_ARCHS = "8.0;9.0;10.0+PTX"  # A100, H100/H200, B200, and PTX for what comes after


def _arch_list(with_cuda: bool) -> str:
    """TORCH_CUDA_ARCH_LIST as the build will use it. With no GPU visible (a CI or build
    machine), torch's own detection has no device to ask and fails: a default list is set."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if with_cuda and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
        return f"{DEFAULT_ARCHS} (default: no GPU visible)"
    return "auto (the visible GPUs)" if with_cuda else "n/a"


def say(msg: str) -> None:
    """A line of what the build does, on stderr (pip shows it with -v) and in the build log."""
    print(f"fastcollate build: {msg}", file=sys.stderr, flush=True)
    BUILD_LOG.write(msg)


class BuildLog:
    """build/fastcollate-build.log: opened (afresh) when something is built, not when pip only asks
    setup.py for metadata; lines said before that are kept for it."""

    def __init__(self, path: str) -> None:
        self.path, self.file, self.pending = path, None, []

    def open(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.file = open(self.path, "w", buffering=1)
        self.file.write(f"fastcollate build, {time.strftime('%Y-%m-%d %H:%M:%S')}, python {sys.version.split()[0]}, "
                        f"torch {torch.__version__} ({os.path.dirname(torch.__file__)})\n")
        for line in self.pending:
            self.file.write(line)

    def write(self, msg: str, prefix: str = "fastcollate build: ") -> None:
        line = f"{prefix}{msg}\n"
        if self.file is None:
            self.pending.append(line)
        else:
            self.file.write(line)


BUILD_LOG = BuildLog(os.path.join(HERE, "build", "fastcollate-build.log"))
WITH_CUDA, WHY = _cuda_decision()
say(f"{'CPU+CUDA' if WITH_CUDA else 'CPU only'} ({WHY}); "
    f"MAX_JOBS={os.environ.get('MAX_JOBS', 'auto')}, TORCH_CUDA_ARCH_LIST={_arch_list(WITH_CUDA)}")
JPEG, JPEG_WHY = _jpeg_decision()
say(f"JPEG decode {'compiled (libjpeg-turbo)' if JPEG else 'not compiled: images decode with Pillow'} ({JPEG_WHY})")

# -g0 after Python's own CFLAGS (which carry -g): debug info for torch's headers in every object
# cost about a third of the compile time and made a 47 MB module of a 1 MB one
opt = ["-O0", "-g"] if DEBUG else ["-O3"]
cxx_flags = opt + ([] if DEBUG else ["-g0"]) + ["-fvisibility=hidden", "-Wall", "-Wno-unused-parameter"]
define_macros = [("FASTCOLLATE_WITH_CUDA", "1" if WITH_CUDA else "0"), ("FASTCOLLATE_WITH_JPEG", "1" if JPEG else "0")]


def _numpy_include() -> list[str]:
    """numpy's headers, where numpy is installed at build time: numpy leaves and scalars are then
    read from their structs (a few loads) instead of the buffer protocol. Only the header-only
    parts are used (no C-API table), so a module built against numpy 2 reads numpy 1 arrays too."""
    try:
        import numpy
    except ImportError:
        say("numpy leaves: the buffer protocol (numpy is not installed at build time)")
        return []
    say(f"numpy leaves: read from numpy {numpy.__version__}'s structs")
    return [numpy.get_include()]


NUMPY_INCLUDE = _numpy_include()
define_macros.append(("FASTCOLLATE_NUMPY_HEADERS", "1" if NUMPY_INCLUDE else "0"))
# $ORIGIN first: a wheel carries the libjpeg it was built with beside the module (see
# bundle_jpeg); an editable or in-place build has none there and finds the system's
jpeg_kw = {} if not JPEG else {"libraries": ["jpeg"], "library_dirs": JPEG[1],
                               "extra_link_args": ["-Wl,-rpath,$ORIGIN"] + [f"-Wl,-rpath,{d}" for d in JPEG[1]]}


def bundle_jpeg(module_dir: str) -> str | None:
    """Copies the libjpeg the module links (under its soname) beside the module, so that a
    wheel runs where no libjpeg is installed; the copied file, or None."""
    if not JPEG:
        return None
    for d in JPEG[1] + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]:
        link = os.path.join(d, "libjpeg.so")
        if os.path.exists(link):
            real = os.path.realpath(link)
            name = os.path.basename(real)
            soname = name[: name.index(".so.") + 4] + name.split(".so.")[1].split(".")[0] if ".so." in name else name
            dest = os.path.join(module_dir, soname)
            shutil.copyfile(real, dest)
            return dest
    return None

if WITH_CUDA:
    ext = CUDAExtension(
        "fastcollate._C",
        CPP_SOURCES + CUDA_CPP_SOURCES + CU_SOURCES,
        include_dirs=[os.path.join(HERE, "csrc")] + (JPEG[0] if JPEG else []) + NUMPY_INCLUDE,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": opt + ["--expt-relaxed-constexpr"]},
        **jpeg_kw,
    )
else:
    ext = CppExtension(
        "fastcollate._C",
        CPP_SOURCES,
        include_dirs=[os.path.join(HERE, "csrc")] + (JPEG[0] if JPEG else []) + NUMPY_INCLUDE,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags},
        **jpeg_kw,
    )


def editable_build_temp() -> str:
    """Where an editable install keeps its objects: one folder per Python and torch installation
    (their headers are in every compile command, so two environments never share objects; ninja
    recompiles what a changed source, header or flag touches)."""
    where = f"{sys.executable}|{os.path.dirname(torch.__file__)}|{torch.__version__}"
    tag = f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__.split('+')[0]}"
    return os.path.join(HERE, "build", f"editable-{tag}-{hashlib.sha1(where.encode()).hexdigest()[:8]}")


# ninja -v prints "[3/22] c++ ... -c /abs/csrc/python/pad.cpp -o ..." as each file is done
NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] ")


def _source_of(command: str) -> str:
    sources = re.findall(r"\s-c\s+([^\s-]\S*)", command)
    return os.path.relpath(sources[-1], HERE) if sources else command[:60]


@contextlib.contextmanager
def ninja_progress(start: float):
    """While torch runs ninja (which writes to fd 1): each command line it prints becomes one short
    line, the file and the time so far, on stderr and in the log, the command in the log only;
    anything else (the compiler's warnings and errors, setuptools' lines) passes through unchanged."""
    sys.stdout.flush()
    saved = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)

    def pump() -> None:
        with os.fdopen(read_end, "r", errors="replace") as lines:
            for line in lines:
                m = NINJA_STEP.match(line)
                BUILD_LOG.write(line.rstrip("\n"), prefix="")
                if m:
                    say(f"[{m.group(1)}/{m.group(2)}] {_source_of(line)} ({time.monotonic() - start:.0f} s)")
                else:
                    os.write(saved, line.encode())

    thread = threading.Thread(target=pump, name="fastcollate-build-log", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)  # closes the pipe's last write end: the pump reads to its end
        thread.join()
        os.close(saved)


def _compiled_since(ninja_log: str, offset: int) -> list[tuple[float, str]]:
    """(seconds, object named as its source, csrc/python/pad) of what ninja compiled after
    ``offset`` bytes of its log, slowest first."""
    if not os.path.exists(ninja_log):
        return []
    with open(ninja_log) as f:
        f.seek(offset)
        rows = [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]
    where = os.path.dirname(ninja_log)
    done = [((int(r[1]) - int(r[0])) / 1000, os.path.relpath(r[3], where).removesuffix(".o")) for r in rows if len(r) >= 4]
    return sorted(done, reverse=True)


class BuildWithRecord(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension, plus the build record beside each built module: in the build folder
    (what a wheel packs) and, for --inplace and editable installs, in the source package too; and
    an editable install's objects kept in build/ (see editable_build_temp), and what the build
    does said as it goes (see ninja_progress)."""

    def finalize_options(self):
        super().finalize_options()
        if getattr(self, "editable_mode", False):  # setuptools gave a new temporary folder
            self.build_temp = editable_build_temp()

    def build_extensions(self):
        BUILD_LOG.open()
        ninja_log = os.path.join(self.build_temp, ".ninja_log")
        offset = os.path.getsize(ninja_log) if os.path.exists(ninja_log) else 0
        sources = sum(len(e.sources) for e in self.extensions)
        say(f"compiling what changed of {sources} sources into {os.path.relpath(self.build_temp, HERE)} "
            f"(everything, the first time: a few minutes on 2 cores); this log: {BUILD_LOG.path}")
        start = time.monotonic()
        with ninja_progress(start):
            super().build_extensions()
        done = _compiled_since(ninja_log, offset)
        if done:
            slowest = ", ".join(f"{src} {sec:.0f} s" for sec, src in done[:3])
            say(f"compiled {len(done)} of {sources} files and linked in {time.monotonic() - start:.0f} s "
                f"(the slowest: {slowest})")
        else:
            say(f"nothing to compile: the objects are up to date; linked in {time.monotonic() - start:.0f} s")

    def run(self):
        super().run()
        build_py = self.get_finalized_command("build_py")
        for e in self.extensions:
            fullname = self.get_ext_fullname(e.name)
            dirs = {os.path.dirname(os.path.join(self.build_lib, self.get_ext_filename(fullname)))}
            if self.inplace:  # (setuptools builds in build_lib, then copies the module into the package)
                dirs.add(build_py.get_package_dir(fullname.rpartition(".")[0]))
            for d in sorted(dirs):
                path = buildinfo.write(d, cuda_kernels=WITH_CUDA)
                say(f"recorded {buildinfo.describe(buildinfo.running())} in {path}")
            if not self.inplace and not getattr(self, "editable_mode", False):
                copied = bundle_jpeg(os.path.dirname(os.path.join(self.build_lib, self.get_ext_filename(fullname))))
                if copied:
                    say(f"the wheel carries {os.path.basename(copied)} (libjpeg-turbo) beside the module")


setup(ext_modules=[ext], cmdclass={"build_ext": BuildWithRecord})
