"""Compile the engines in kernels/cpu and kernels/cuda (and the host loops of kernels/host) at first use,
once per source hash, and load them.

Each engine is a folder of C++/CUDA sources whose TORCH_LIBRARY_IMPL blocks register the CPU or CUDA
kernels of the swcli operators (their schemas are defined in swcli/ops.py). torch.utils.cpp_extension.load
compiles the folder's sources with ninja, in parallel, and loads the library into the process.

The build directory is named after a hash of everything that changes the binary (every file of the folder,
flags, torch and Python versions, the CPU's instruction set, since we compile with -march=native, and the
compilers: $CXX as given, the executable it resolves to, and that file's size and time, so another or an
upgraded compiler is a new build that says so), so a stale binary is never loaded and a rebuild happens
only when something really changed. Builds are serialised by an fcntl lock that the kernel releases when
a process dies, so a lock file left behind by a killed compile is recognised as stale and removed instead
of making the next run hang.

A library already built is loaded directly (torch.ops.load_library), not through cpp_extension.load, which
would run the compiler and ninja on every load: so a built engine loads on a machine without a compiler
(where the compiler cannot be found, the newest build of the same sources and settings is loaded). A
library that is truncated or fails to load is removed with its build directory's outputs and built once
more; a compiler that does not work, or a build that fails, is one line (the full log is kept in the
build directory).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
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


def _compiler() -> tuple[str, str | None]:
    """$CXX as the build uses it (default c++), and the real path of the executable its first word
    resolves to (None: not found)."""
    compiler = os.environ.get("CXX", "c++")
    words = compiler.split()
    found = shutil.which(words[0]) if words else None
    return compiler, os.path.realpath(found) if found else None


def _nvcc() -> str | None:
    """The real path of CUDA_HOME/bin/nvcc (None: not found)."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME or "/nonexistent") / "bin" / "nvcc"
    return os.path.realpath(nvcc) if nvcc.is_file() else None


def _file_identity(path: str) -> str:
    # size and modification time stand in for the version: cheap (no compiler run on each load), and
    # an upgrade rewrites the file
    stat = os.stat(path)
    return f"{path} {stat.st_size} {stat.st_mtime_ns}"


def _toolchain_identity(cuda: bool) -> str | None:
    """What identifies the compilers of a build, for its cache key; None when one cannot be found."""
    compiler, resolved = _compiler()
    if resolved is None:
        return None
    identity = f"CXX={compiler}\n{_file_identity(resolved)}"
    if cuda:
        nvcc = _nvcc()
        if nvcc is None:
            return None
        identity += f"\nnvcc={_file_identity(nvcc)}"
    return identity


def _scripts_folder_on_path() -> None:
    """pip installs ninja into this interpreter's scripts folder, which need not be on PATH (`python3 -m
    swcli`, a virtual environment not activated), while torch's build runs `ninja` from PATH: so that
    folder goes at PATH's end where ninja is found there and nowhere on PATH."""
    scripts = sysconfig.get_path("scripts")
    if shutil.which("ninja") is None and scripts and shutil.which("ninja", path=scripts):
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), scripts]))


def _check_toolchain(cuda: bool = False) -> None:
    compiler, resolved = _compiler()
    if resolved is None:
        raise BuildError(
            f"no C++ compiler found (looked for '{compiler}'; set CXX or install g++): "
            "swcli compiles its CPU engine on first use"
        )
    from torch.utils.cpp_extension import is_ninja_available

    _scripts_folder_on_path()
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


def _first_line(text: str, limit: int = 300) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "no output")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_error_line(text: str) -> str:
    """The line of a build log that says what went wrong: the first compiler or linker error
    ('file:line:col: error: ...', 'fatal error: ...', 'collect2: error: ...'), else ninja's first
    FAILED line, else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (r"\berror:", r"^FAILED:"):
        for line in lines:
            if re.search(pattern, line, re.IGNORECASE):
                return _first_line(line)
    return _first_line(text)


def _check_compiler_runs() -> None:
    """Run `$CXX --version` once before a build: a compiler that does not run is one line naming it,
    not torch's traceback (only when compiling, so loading a built engine runs no compiler)."""
    compiler, resolved = _compiler()
    try:
        result = subprocess.run([*compiler.split(), "--version"], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"the C++ compiler '{compiler}' ({resolved}) cannot be run: {exc}") from None
    if result.returncode != 0:
        output = (result.stderr or "") + (result.stdout or "")
        raise BuildError(
            f"the C++ compiler '{compiler}' ({resolved}) does not work: '{compiler} --version' exited with "
            f"status {result.returncode}: {_first_error_line(output)}; set CXX to a working C++ compiler"
        )


def _library_problem(library: Path) -> str | None:
    """Why `library` cannot be a whole shared library, or None if it looks whole. Checked before
    loading: loading an ELF file cut short can kill the process with SIGBUS instead of raising. The
    ELF header says where the program and section header tables lie, and those tables where each
    segment and section lies; the file must hold all of them."""
    try:
        size = library.stat().st_size
        if not sys.platform.startswith("linux"):
            return None if size else "empty file"
        with open(library, "rb") as f:
            head = f.read(64)
            if len(head) >= 6 and (head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2)):
                return f"not an ELF shared library ({size} bytes)"
            wide, order = head[4:5] == b"\x02", "<" if head[5:6] == b"\x01" else ">"
            if len(head) < (64 if wide else 52):
                return f"file too short ({size} bytes)"
            if wide:
                phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
            else:
                phoff, shoff = struct.unpack_from(order + "II", head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 42)
            end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
            if end > size:
                return f"file too short ({size} bytes; its ELF headers reach byte {end})"
            f.seek(phoff)
            programs = f.read(phentsize * phnum)
            f.seek(shoff)
            sections = f.read(shentsize * shnum)
        for k in range(phnum):  # segments: p_offset, p_filesz
            fields = struct.unpack_from(order + ("IIQQQQ" if wide else "IIIII"), programs, k * phentsize)
            offset, length = (fields[2], fields[5]) if wide else (fields[1], fields[4])
            end = max(end, offset + length)
        for k in range(shnum):  # sections: sh_type, sh_offset, sh_size; NOBITS (8) takes no file space
            fields = struct.unpack_from(order + ("IIQQQQ" if wide else "IIIIII"), sections, k * shentsize)
            if fields[1] != 8:
                end = max(end, fields[4] + fields[5])
    except OSError as exc:
        return exc.strerror or str(exc)
    except struct.error:
        return f"corrupt ELF headers ({size} bytes)"
    if end > size:
        return f"file too short ({size} bytes; its segments and sections reach byte {end})"
    return None


def _load_library(library: Path) -> None:
    """Load a built engine into the process (its TORCH_LIBRARY_IMPL blocks register the kernels)."""
    import torch

    torch.ops.load_library(str(library))


def _clear_build_dir(build_dir: Path) -> None:
    """Remove a build directory's outputs (objects, library, ninja's files and log), so that the next
    build compiles everything again rather than trusting ninja's log."""
    for entry in build_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _newest_build(name: str, prefix: str) -> str | None:
    """The module name of the newest whole library built from the same sources and settings by any
    compiler (for a machine where the compiler cannot be found), or None."""
    try:
        candidates = [d for d in cache_root().glob(f"{prefix}*") if d.is_dir()]
    except OSError:
        return None
    found = []
    for directory in candidates:
        library = directory / f"{directory.name}.so"
        if library.is_file() and _library_problem(library) is None:
            found.append((library.stat().st_mtime, directory.name))
    return max(found)[1] if found else None


def _remove_stale_torch_lock(build_dir: Path) -> None:
    # torch's FileBaton waits forever on build_dir/lock; under our fcntl lock, any such file is stale.
    stale = build_dir / "lock"
    if stale.exists():
        stale.unlink()


def _locked_soon(lock, seconds: float = 1.0) -> bool:
    """Whether the build lock is ours within `seconds`: a process that loads a cached build holds it for
    a moment (torchrun's ranks load at once), one that compiles for a minute, which is worth a message."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return False


def build(name: str, folder: str, extra_cflags: list[str], extra_ldflags: list[str],
          extra_cuda_cflags: tuple[str, ...] = (), cuda_arch: str = "", what: str = "",
          takes: str = "about a minute") -> Engine:
    """Compile every source of kernels/<folder> into one library and load it (cached by content).

    .cpp files go to the host compiler, .cu files to nvcc for cuda_arch (e.g. "9.0"); the headers are
    hashed with them. `what` names the library in messages (default: the <name> engine).
    """
    import torch
    from torch.utils.cpp_extension import load

    what = what or f"the {name} engine"
    files = engine_files(folder)
    cuda = any(f.suffix == ".cu" for f in files)
    key = "\n".join(
        [*(f"{f.name}\n{f.read_text()}" for f in files), *extra_cflags, *extra_ldflags, *extra_cuda_cflags,
         cuda_arch, torch.__version__, str(torch.version.cuda), sys.version, _cpu_signature()]
    )
    # The name: 10 hex digits of what is built, 6 of the compilers that build it.
    prefix = f"swcli_{name}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    toolchain = _toolchain_identity(cuda)
    module_name = None if toolchain is not None else _newest_build(name, prefix)
    if module_name is None:  # with no compiler and no build, the toolchain check below says what is missing
        module_name = prefix + hashlib.sha256(str(toolchain).encode()).hexdigest()[:6]
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
            if not _locked_soon(lock):
                print(f"swcli: waiting for another process that is compiling {what}",
                      file=sys.stderr, flush=True)
                fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_stale_torch_lock(build_dir)
        unreadable = None  # why the cached library could not be loaded
        if library.exists():
            unreadable = _library_problem(library)
            if unreadable is None:
                try:
                    _load_library(library)
                    return Engine(module_name, library)
                except OSError as exc:  # what dlopen's failures raise ("file too short", ...)
                    unreadable = _first_line(str(exc.__cause__ or exc))  # torch wraps dlopen's message
            _clear_build_dir(build_dir)  # ninja's log would call the broken library up to date
        _check_toolchain(cuda=cuda)
        _check_compiler_runs()
        why = f"again (the cached library was unreadable: {unreadable})" if unreadable else "(first use)"
        print(f"swcli: compiling {what} {why}; takes {takes}, in {build_dir}",
              file=sys.stderr, flush=True)
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
        except Exception as exc:  # ninja's RuntimeError, torch's compiler probes, the loader's OSError
            raise BuildError(_build_failure(what, build_dir, exc, unreadable)) from exc
        finally:
            if cuda_arch:
                if saved_arch is None:
                    os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                else:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = saved_arch
    return Engine(module_name, library)


def _build_failure(what: str, build_dir: Path, exc: Exception, unreadable: str | None) -> str:
    """One line for a failed build: the first error line and the compiler; the whole log is written to
    build_dir/build.log."""
    log = str(exc)
    output = getattr(exc, "output", None)  # a CalledProcessError from one of torch's compiler probes
    if output:
        log += "\n" + (output.decode(errors="replace") if isinstance(output, bytes) else str(output))
    where = build_dir / "build.log"
    try:
        where.write_text(log + "\n")
        saved = f"; full log: {where}"
    except OSError:
        saved = ""
    compiler, resolved = _compiler()
    failure = (f"{what} cached in {build_dir} was unreadable ({unreadable}), and rebuilding it failed"
               if unreadable else f"building {what} in {build_dir} failed")
    return f"{failure}: {_first_error_line(log)} (C++ compiler '{compiler}' = {resolved}{saved})"


@functools.lru_cache(maxsize=None)
def cpu_engine() -> Engine:
    """The CPU engine (kernels/cpu), compiled for this CPU and loaded."""
    return build("cpu", "cpu", CPU_FLAGS, ["-fopenmp"])


@functools.lru_cache(maxsize=None)
def host_library() -> Engine:
    """The host pipeline's bulk loops (kernels/host: FASTA scanning, padding rows, TSV rows, tracebacks),
    plain C functions that swcli._host calls through ctypes; -march=native for the traceback's vectors."""
    return build("host", "host", ["-O3", "-march=native"], [], what="the host library", takes="a few seconds")


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
