"""Normalize against a float64 reference (CPU here; the CUDA kernel against the torch path
where a GPU is), its errors, the fastcollate::normalize op (opcheck, bitwise equal to the torch
path Normalize used before it was an op, torch.compile), and the nvcc compile check of every .cu
source."""
import glob
import os
import shutil
import subprocess

import pytest
import torch

import fastcollate
from fastcollate import _ext
from fastcollate.transforms import Normalize, normalize_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # `pytest -m cuda` selects the GPU cases


def reference(x, dtype, channels_last, scale=255.0):
    m = torch.tensor(MEAN, dtype=torch.float64).view(-1, 1, 1)
    s = torch.tensor(STD, dtype=torch.float64).view(-1, 1, 1)
    y = (x.double() / scale - m) / s
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_normalize_matches_float64(device, dtype, tol, channels_last):
    x = torch.randint(0, 256, (5, 3, 17, 13), dtype=torch.uint8, device=device)
    x[0, :, 0, 0] = 0
    x[0, :, 0, 1] = 255
    y = Normalize(MEAN, STD, dtype=dtype, channels_last=channels_last).apply(x)
    assert y.dtype == dtype and y.shape == x.shape and y.device == x.device
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    ref = reference(x.cpu(), dtype, channels_last)
    err = ((y.cpu().double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err <= tol, err


def test_batch_keys_and_index():
    n = Normalize([0.0], [1.0], keys=[0])
    out = n([torch.full((2, 1, 2, 2), 51, dtype=torch.uint8), torch.tensor([1, 2])])
    assert torch.allclose(out[0], torch.full((2, 1, 2, 2), 0.2)) and out[1].tolist() == [1, 2]


@pytest.mark.parametrize("bad,err,match", [
    (torch.zeros(2, 3, 4, 4), TypeError, "must be uint8"),
    (torch.zeros(2, 4, 4, 4, dtype=torch.uint8), ValueError, "4 channels"),
    (torch.zeros(4, 4, dtype=torch.uint8), ValueError, r"\[N, C, H, W\]"),
    ("text", TypeError, "uint8 tensor"),
])
def test_rejects_bad_input(bad, err, match):
    with pytest.raises(err, match=match):
        Normalize(MEAN, STD)({"image": bad})


def test_missing_key_and_bad_arguments():
    with pytest.raises(KeyError, match="no leaf 'image'"):
        Normalize(MEAN, STD)({"img": torch.zeros(1, 3, 1, 1, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="one value per channel"):
        Normalize([0.5, 0.5], [0.5])
    with pytest.raises(ValueError, match="dtype"):
        Normalize(MEAN, STD, dtype=torch.int32)
    with pytest.raises(ValueError, match="std"):
        Normalize([0.0], [0.0])
    with pytest.raises(ValueError, match="channels_last"):
        Normalize(MEAN, STD, channels_last=True).apply(torch.zeros(3, 2, 2, dtype=torch.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_kernel_equals_torch_path_bitwise(dtype, channels_last):
    """The kernel against the torch path on the CPU (same fp32 operations, true divisions) and on
    the GPU (the scale is a tensor there too: CUDA turns a division by a Python scalar into a
    multiplication by its reciprocal, which can differ in the last bit)."""
    assert fastcollate.cuda_kernels_built(), "the CUDA kernel was not built"
    x = torch.randint(0, 256, (4, 3, 31, 29), dtype=torch.uint8, device="cuda")
    n = Normalize(MEAN, STD, dtype=dtype, channels_last=channels_last)
    a = n.apply(x)
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    for b in (n._torch(x.cpu()), n._torch(x).cpu()):
        assert a.stride() == b.stride()
        assert torch.equal(a.cpu().view(bits), b.view(bits))


def test_torch_path_divides_by_a_tensor_not_a_python_scalar():
    # what keeps the CUDA torch path bitwise equal to the kernel (see the test above)
    n = Normalize(MEAN, STD)
    mean, std, scale = n._constants(torch.device("cpu"))
    assert isinstance(scale, torch.Tensor) and scale.item() == 255.0
    x = torch.arange(3 * 4, dtype=torch.uint8).view(3, 2, 2)
    want = ((x.double() / 255.0 - torch.tensor(MEAN, dtype=torch.float64).view(-1, 1, 1))
            / torch.tensor(STD, dtype=torch.float64).view(-1, 1, 1)).float()
    assert torch.allclose(n.apply(x), want, atol=1e-6, rtol=0)


needs_op = pytest.mark.skipif(_ext._C is None, reason="the op is registered by the compiled engine")


def previous_torch_path(n, x):
    """What Normalize computed before it was an op, on every device but a CUDA build's GPU."""
    host = torch.tensor(n.mean + n.std + [n.scale], dtype=torch.float32).to(x.device)
    c = len(n.mean)
    mean, std, scale = host[:c], host[c:2 * c], host[2 * c]
    y = x.to(torch.float32).div_(scale).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    if n.channels_last:
        return y.to(dtype=n.dtype, memory_format=torch.channels_last)
    return y.to(n.dtype)


def op_inputs(x, dtype, channels_last):
    c = x.shape[-3]
    mean = torch.tensor(MEAN[:c], dtype=torch.float32, device=x.device)
    std = torch.tensor(STD[:c], dtype=torch.float32, device=x.device)
    return (x, mean, std, torch.tensor(255.0, device=x.device), dtype, channels_last)


SHAPES = [(4, 3, 9, 7), (3, 5, 6), "sliced", "channels_last_input"]


def image(shape, device):
    if shape == "sliced":  # a non-contiguous view
        return torch.randint(0, 256, (4, 3, 10, 14), dtype=torch.uint8, device=device)[:, :, 1:, ::2]
    if shape == "channels_last_input":
        return torch.randint(0, 256, (2, 3, 5, 6), dtype=torch.uint8, device=device).to(
            memory_format=torch.channels_last)
    return torch.randint(0, 256, shape, dtype=torch.uint8, device=device)


@needs_op
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_op_passes_opcheck(device, dtype, channels_last, shape):
    x = image(shape, device)
    if channels_last and x.dim() != 4:
        pytest.skip("channels_last needs 4-D input")
    torch.library.opcheck(torch.ops.fastcollate.normalize, op_inputs(x, dtype, channels_last))


@needs_op
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_op_equals_the_previous_torch_path_bitwise(device, dtype, channels_last, shape):
    x = image(shape, device)
    if channels_last and x.dim() != 4:
        pytest.skip("channels_last needs 4-D input")
    x[..., 0, 0], x[..., 0, 1] = 0, 255  # the ends of the range
    n = Normalize(MEAN[:x.shape[-3]], STD[:x.shape[-3]], dtype=dtype, channels_last=channels_last)
    got, want = n.apply(x), previous_torch_path(n, x)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(got.view(bits), want.view(bits))
    direct = torch.ops.fastcollate.normalize(*op_inputs(x, dtype, channels_last))
    assert torch.equal(direct.view(bits), want.view(bits)) and direct.stride() == want.stride()


@needs_op
def test_normalize_calls_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    n = Normalize(MEAN, STD)
    x = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    n.apply(x)  # constants made outside the mode
    with Seen() as seen:
        n.apply(x)
    assert seen.ops == ["fastcollate.normalize.default"], seen.ops


@needs_op
@pytest.mark.parametrize("bad,match", [
    (lambda x, m, s, k: (x.float(), m, s, k), "expected uint8"),
    (lambda x, m, s, k: (x, m[:2], s, k), "mean must be a contiguous float32 tensor of 3"),
    (lambda x, m, s, k: (x, m, s.double(), k), "std must be"),
    (lambda x, m, s, k: (x, m, s, torch.ones(2)), "scale must be a one-element"),
    (lambda x, m, s, k: (x[0, 0], m, s, k), r"\[N, C, H, W\]"),
])
def test_op_checks_its_arguments(bad, match):
    x, mean, std, scale, _, _ = op_inputs(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.float32, False)
    with pytest.raises(RuntimeError, match=match):
        torch.ops.fastcollate.normalize(*bad(x, mean, std, scale), torch.float32, False)
    with pytest.raises(RuntimeError, match="output dtype"):
        torch.ops.fastcollate.normalize(x, mean, std, scale, torch.int32, False)
    with pytest.raises(RuntimeError, match="channels_last needs 4-D"):
        torch.ops.fastcollate.normalize(x[0], mean, std, scale, torch.float32, True)


@needs_op
@pytest.mark.parametrize("channels_last", [False, True])
def test_normalize_compiles_with_fullgraph(channels_last):
    n = Normalize(MEAN, STD, dtype=torch.bfloat16, keys=["image"], channels_last=channels_last)

    def step(batch):
        return n(batch)["image"].float().mean()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
        assert torch.equal(compiled({"image": x}), step({"image": x}))


def test_reference_serves_without_the_op(monkeypatch):
    monkeypatch.setattr(_ext, "_C", None)
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    n = Normalize(MEAN, STD)
    assert torch.equal(n.apply(x), previous_torch_path(n, x))


NVCC = shutil.which("nvcc") or (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))


@pytest.mark.skipif(not os.path.exists(NVCC), reason="nvcc not found")
@pytest.mark.parametrize("source", sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu"))) or ["<none>"])
def test_cu_sources_compile(source, tmp_path):
    """Syntax and types of every kernel checked by nvcc (nothing run: no GPU needed)."""
    assert source != "<none>", "no .cu sources found"
    r = subprocess.run([NVCC, "-std=c++17", "-c", source, "-o", str(tmp_path / "k.o")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


CUDA_INCLUDE = next((d for d in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"),
                                  os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(NVCC))), "include"))
                     if os.path.exists(os.path.join(d, "cuda_runtime.h"))), "")


@pytest.mark.skipif(not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda_runtime.h")), reason="CUDA headers not found")
@pytest.mark.parametrize("source", ["csrc/cuda/normalize_op.cpp", "csrc/cuda/host_register.cpp", "csrc/bindings/module.cpp"])
def test_cuda_side_cpp_compiles(source, tmp_path):
    """The torch-facing CUDA wrapper, and the bindings as a CUDA build sees them, type-checked by
    g++ against torch's headers. A CPU wheel lacks one CMake-generated header of c10/cuda; a
    stub with its one macro stands in."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-DFASTCOLLATE_WITH_CUDA=1", "-DTORCH_EXTENSION_NAME=_C",
           f"-I{tmp_path}", f"-I{CUDA_INCLUDE}", f"-I{os.path.join(ROOT, 'csrc')}", f"-I{os.path.join(ROOT, 'csrc', 'cuda')}",
           f"-I{sysconfig.get_paths()['include']}"] + [f"-I{p}" for p in include_paths()] + [os.path.join(ROOT, source)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
