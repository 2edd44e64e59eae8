"""Compile the engines in kernels/cpu and kernels/cuda at first use, once per source hash, and load them.

Each engine is a folder of C++/CUDA sources whose TORCH_LIBRARY_IMPL blocks register the CPU or CUDA
kernels of the swcli operators (their schemas are defined in swcli/ops.py). torch.utils.cpp_extension.load
compiles the folder's sources with ninja, in parallel, and loads the library into the process.

The build directory is named after a hash of everything that changes the binary (every file of the folder,
flags, torch and Python versions, the CPU's instruction set, since we compile with -march=native), so a
stale binary is never loaded and a rebuild happens only when something really changed. Builds are
serialised by an fcntl lock that the kernel releases when a process dies, so a lock file left behind by a
killed compile is recognised as stale and removed instead of making the next run hang.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from swcli._files import packaged_folder

CPU_FLAGS = ["-O3", "-march=native", "-fopenmp"]
SOURCE_SUFFIXES = (".cpp", ".cu")
HEADER_SUFFIXES = (".h", ".cuh")


class BuildError(RuntimeError):
    """A kernel could not be compiled or loaded (missing compiler, ninja, or a failed build)."""


@dataclass(frozen=True)
class Engine:
    """A compiled engine, loaded into the process: its operators are reached through torch.ops.swcli."""

    name: str  # the module name: the engine's name and the hash of what built it
    library: Path  # the shared library loaded


def engine_files(folder: str) -> list[Path]:
    """The sources and headers of kernels/<folder>, sorted by name, from the checkout or the package."""
    try:
        directory = packaged_folder("kernels", folder)
    except FileNotFoundError as exc:
        raise BuildError(str(exc)) from None
    files = sorted(f for f in directory.iterdir() if f.suffix in SOURCE_SUFFIXES + HEADER_SUFFIXES)
    if not any(f.suffix in SOURCE_SUFFIXES for f in files):
        raise BuildError(f"kernels/{folder} in {directory} holds no source file")
    return files


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


def build(name: str, folder: str, extra_cflags: list[str], extra_ldflags: list[str],
          extra_cuda_cflags: tuple[str, ...] = (), cuda_arch: str = "") -> Engine:
    """Compile every source of kernels/<folder> into one library and load it (cached by content).

    .cpp files go to the host compiler, .cu files to nvcc for cuda_arch (e.g. "9.0"); the headers are
    hashed with them.
    """
    import torch
    from torch.utils.cpp_extension import load

    files = engine_files(folder)
    cuda = any(f.suffix == ".cu" for f in files)
    key = "\n".join(
        [*(f"{f.name}\n{f.read_text()}" for f in files), *extra_cflags, *extra_ldflags, *extra_cuda_cflags,
         cuda_arch, torch.__version__, str(torch.version.cuda), sys.version, _cpu_signature()]
    )
    module_name = f"swcli_{name}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    build_dir = cache_root() / module_name
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_root() / f"{module_name}.lock", "w")
    except OSError as exc:
        raise BuildError(f"cannot use the kernel cache {cache_root()} ({exc.strerror}); "
                         "point SWCLI_CACHE_DIR at a writable folder") from None
    library = build_dir / f"{module_name}.so"
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"swcli: waiting for another process that is compiling the {name} engine",
                  file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_stale_torch_lock(build_dir)
        if not library.exists():
            _check_toolchain(cuda=cuda)
            print(
                f"swcli: compiling the {name} engine (first use; takes about a minute) in {build_dir}",
                file=sys.stderr,
                flush=True,
            )
        options = {}
        if cuda:
            options = dict(extra_cuda_cflags=list(extra_cuda_cflags), with_cuda=True)
        saved_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        try:
            if cuda_arch:
                os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch  # load turns it into -gencode flags
            load(
                name=module_name,
                sources=[str(f) for f in files if f.suffix in SOURCE_SUFFIXES],
                extra_cflags=extra_cflags,
                extra_ldflags=extra_ldflags,
                extra_include_paths=[str(files[0].parent)],
                build_directory=str(build_dir),
                is_python_module=False,
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
    return Engine(module_name, library)


@functools.lru_cache(maxsize=None)
def cpu_engine() -> Engine:
    """The CPU engine (kernels/cpu), compiled for this CPU and loaded."""
    return build("cpu", "cpu", CPU_FLAGS, ["-fopenmp"])


@functools.lru_cache(maxsize=None)
def cuda_engine() -> Engine:
    """The CUDA engine (kernels/cuda), compiled for the current device's architecture and loaded."""
    import torch

    if not torch.cuda.is_available():
        raise BuildError("the CUDA engine needs a CUDA device, and torch sees none "
                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    major, minor = torch.cuda.get_device_capability()
    return build("cuda", "cuda", ["-O3"], [], extra_cuda_cflags=("-O3", "-std=c++17", "-lineinfo"),
                 cuda_arch=f"{major}.{minor}")
