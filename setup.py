"""Build fastcollate._C with torch.utils.cpp_extension (ninja).

Switches are read once, here, and the decision is printed:
  FASTCOLLATE_NO_CUDA=1     never build the CUDA kernels
  FASTCOLLATE_FORCE_CUDA=1  build them even when torch reports no GPU (needs a CUDA torch + nvcc)
  MAX_JOBS, TORCH_CUDA_ARCH_LIST are honoured by torch's BuildExtension itself.
Install with: pip install --no-build-isolation -e .
Package with: python -m build --no-isolation  (an sdist, and a wheel built from it)
Beside the module, the build writes the record of the torch it was built against
(fastcollate/_C.build.json, see fastcollate/_buildinfo.py), which fastcollate checks at import.
"""
import glob
import importlib.util
import os
import shutil

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


WITH_CUDA, WHY = _cuda_decision()
print(f"fastcollate build: {'CPU+CUDA' if WITH_CUDA else 'CPU only'} ({WHY}); "
      f"MAX_JOBS={os.environ.get('MAX_JOBS', 'auto')}, TORCH_CUDA_ARCH_LIST={_arch_list(WITH_CUDA)}")

opt = ["-O0", "-g"] if DEBUG else ["-O3"]
cxx_flags = opt + ["-fvisibility=hidden", "-Wall", "-Wno-unused-parameter"]
define_macros = [("FASTCOLLATE_WITH_CUDA", "1" if WITH_CUDA else "0")]

if WITH_CUDA:
    ext = CUDAExtension(
        "fastcollate._C",
        CPP_SOURCES + CUDA_CPP_SOURCES + CU_SOURCES,
        include_dirs=[os.path.join(HERE, "csrc")],
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": opt + ["--expt-relaxed-constexpr"]},
    )
else:
    ext = CppExtension(
        "fastcollate._C",
        CPP_SOURCES,
        include_dirs=[os.path.join(HERE, "csrc")],
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags},
    )


class BuildWithRecord(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension, plus the build record beside each built module: in the build folder
    (what a wheel packs) and, for --inplace and editable installs, in the source package too."""

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
                print(f"fastcollate build: recorded {buildinfo.describe(buildinfo.running())} in {path}")


setup(ext_modules=[ext], cmdclass={"build_ext": BuildWithRecord})
