"""Compile the kernels in kernels/ with torch.utils.cpp_extension.load_inline, once per source hash.

The build directory is named after a hash of everything that changes the binary (sources, flags, torch and
Python versions, the CPU's instruction set, since we compile with -march=native), so a stale binary is
never loaded and a rebuild happens only when something really changed. Builds are serialised by an
fcntl lock that the kernel releases when a process dies, so a lock file left behind by a killed compile
is recognised as stale and removed instead of making the next run hang.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

from swcli._files import packaged_file

CPU_FLAGS = ["-O3", "-march=native", "-fopenmp"]


class BuildError(RuntimeError):
    """A kernel could not be compiled or loaded (missing compiler, ninja, or a failed build)."""


def kernel_source(filename: str) -> str:
    """The text of kernels/<filename>, from the checkout or the installed package."""
    try:
        return packaged_file("kernels", filename).read_text()
    except FileNotFoundError as exc:
        raise BuildError(str(exc)) from None


def kernel_directory() -> Path:
    """The folder holding the kernels (for the headers the sources include)."""
    try:
        return packaged_file("kernels", "sw_cuda.h").parent
    except FileNotFoundError as exc:
        raise BuildError(str(exc)) from None


def cache_root() -> Path:
    """Where compiled kernels live: $SWCLI_CACHE_DIR, else ~/.cache/swcli (XDG_CACHE_HOME respected)."""
    if os.environ.get("SWCLI_CACHE_DIR"):
        return Path(os.environ["SWCLI_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "swcli"


def _cpu_signature() -> str:
    """The instruction-set flags of this CPU: a -march=native binary must not move to another CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _check_toolchain(cuda: bool = False) -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise BuildError(
            f"no C++ compiler found (looked for '{compiler}'; set CXX or install g++): "
            "swcli compiles its CPU engine on first use"
        )
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        raise BuildError("ninja is not available: install it with 'pip install ninja'")
    if cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        nvcc = Path(CUDA_HOME or "/nonexistent") / "bin" / "nvcc"
        if not nvcc.is_file():
            raise BuildError(
                "nvcc (the CUDA compiler) was not found: install the CUDA toolkit that matches torch's "
                "CUDA, or set CUDA_HOME; swcli compiles its CUDA engine on first use"
            )


def _remove_stale_torch_lock(build_dir: Path) -> None:
    # torch's FileBaton waits forever on build_dir/lock; under our fcntl lock, any such file is stale.
    stale = build_dir / "lock"
    if stale.exists():
        stale.unlink()


def build(name: str, sources: list[str], extra_cflags: list[str], extra_ldflags: list[str],
          cuda_sources: tuple[str, ...] = (), extra_cuda_cflags: tuple[str, ...] = (),
          headers: tuple[str, ...] = (), cuda_arch: str = ""):
    """load_inline the given kernels/ files as one module; returns the loaded Python module.

    C++ sources go to the host compiler, cuda_sources to nvcc for cuda_arch (e.g. "9.0"); headers are
    kernels/ files they include, hashed with them.
    """
    import inspect

    import torch
    from torch.utils.cpp_extension import load_inline

    text = [kernel_source(s) for s in sources]
    cuda_text = [kernel_source(s) for s in cuda_sources]
    header_text = [kernel_source(h) for h in headers]
    key = "\n".join(
        [*text, *cuda_text, *header_text, *extra_cflags, *extra_ldflags, *extra_cuda_cflags, cuda_arch,
         torch.__version__, str(torch.version.cuda), sys.version, _cpu_signature()]
    )
    module_name = f"swcli_{name}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    build_dir = cache_root() / module_name
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_root() / f"{module_name}.lock", "w")
    except OSError as exc:
        raise BuildError(f"cannot use the kernel cache {cache_root()} ({exc.strerror}); "
                         "point SWCLI_CACHE_DIR at a writable folder") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"swcli: waiting for another process that is compiling the {name} engine",
                  file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_stale_torch_lock(build_dir)
        if not (build_dir / f"{module_name}.so").exists():
            _check_toolchain(cuda=bool(cuda_sources))
            print(
                f"swcli: compiling the {name} engine (first use; takes about a minute) in {build_dir}",
                file=sys.stderr,
                flush=True,
            )
        options = {}
        if cuda_sources:
            options = dict(cuda_sources=cuda_text, extra_cuda_cflags=list(extra_cuda_cflags), with_cuda=True,
                           extra_include_paths=[str(kernel_directory())])
            if "no_implicit_headers" in inspect.signature(load_inline).parameters:
                options["no_implicit_headers"] = True  # keep torch's headers out of nvcc's work
        saved_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        try:
            if cuda_arch:
                os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch  # load_inline turns it into -gencode flags
            return load_inline(
                name=module_name,
                cpp_sources=text,
                extra_cflags=extra_cflags,
                extra_ldflags=extra_ldflags,
                build_directory=str(build_dir),
                verbose=False,
                **options,
            )
        except (RuntimeError, OSError, ImportError) as exc:
            raise BuildError(f"building the {name} engine in {build_dir} failed: {exc}") from exc
        finally:
            if cuda_arch:
                if saved_arch is None:
                    os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                else:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = saved_arch


@functools.lru_cache(maxsize=None)
def cpu_engine():
    """The compiled CPU engine (kernels/sw_cpu.cpp): forward(S, qlen, tlen, gap, t, keep) and backward."""
    return build("cpu", ["sw_cpu.cpp"], CPU_FLAGS, ["-fopenmp"])


@functools.lru_cache(maxsize=None)
def cuda_engine():
    """The compiled CUDA engine (kernels/sw_cuda.cu + its binding kernels/sw_cuda.cpp), built for the
    current device's architecture: forward, forward_codes, backward, empty_launch."""
    import torch

    if not torch.cuda.is_available():
        raise BuildError("the CUDA engine needs a CUDA device, and torch sees none "
                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    major, minor = torch.cuda.get_device_capability()
    return build("cuda", ["sw_cuda.cpp"], ["-O3"], [], cuda_sources=("sw_cuda.cu",),
                 extra_cuda_cflags=("-O3", "-std=c++17", "-lineinfo"), headers=("sw_cuda.h",),
                 cuda_arch=f"{major}.{minor}")
