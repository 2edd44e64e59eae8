"""The build cache (swcli/_build.py): toolchain, cache naming (compiler included), first-compile message,
one-line errors, broken libraries rebuilt, stale locks."""

# Stale-lock recovery: a build never hangs. Only the real-engine tests load the compiled CPU engine (from
# the cache; it compiles once, ~35 s, if the cache is cold), and one rebuilds a copy of it (~15-40 s).
# Everything else fakes cpp_extension.load (and the loading of a built library), so nothing compiles.

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp_extension

from swcli import _build
from swcli._build import BuildError

REPO = Path(__file__).resolve().parent.parent
NO_COMPILER = "swcli-test-no-such-compiler"
A_SHARED_LIBRARY = Path(torch._C.__file__)  # a small, whole ELF shared library, to stand for a built engine


def compiler_script(folder: Path, name: str, body: str) -> str:
    """An executable shell script in folder, to stand for a compiler."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------------------------------------
# Toolchain


def test_build_error_is_a_runtime_error():
    assert issubclass(BuildError, RuntimeError)


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setenv("CXX", NO_COMPILER)
    with pytest.raises(BuildError, match=rf"no C\+\+ compiler found \(looked for '{NO_COMPILER}'"):
        _build._check_toolchain()


def test_missing_ninja_is_named(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    with pytest.raises(BuildError, match=r"ninja is not available"):
        _build._check_toolchain()


def test_ninja_in_the_scripts_folder_is_found_off_path(monkeypatch, tmp_path):
    # python3 -m swcli from an interpreter whose scripts folder (pip's ninja) is not on PATH
    scripts = tmp_path / "bin"
    scripts.mkdir()
    ninja = scripts / "ninja"
    ninja.write_text("#!/bin/sh\necho 1.11.1\n")
    ninja.chmod(0o755)
    monkeypatch.setenv("CXX", shutil.which("c++"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(_build.sysconfig, "get_path", lambda name: str(scripts))
    assert _build._check_toolchain() is None
    assert os.environ["PATH"].split(os.pathsep) == [str(tmp_path / "empty"), str(scripts)]


def test_ninja_on_path_leaves_path_alone(monkeypatch, tmp_path):
    for folder in ("on_path", "scripts"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ninja").write_text("#!/bin/sh\necho 1.11.1\n")
        (tmp_path / folder / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "on_path"))
    monkeypatch.setattr(_build.sysconfig, "get_path", lambda name: str(tmp_path / "scripts"))
    _build._scripts_folder_on_path()
    assert os.environ["PATH"] == str(tmp_path / "on_path")


def test_toolchain_present_here(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    assert _build._check_toolchain() is None


def test_build_without_compiler_fails_before_compiling(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", NO_COMPILER)

    def must_not_compile(**kwargs):
        raise AssertionError("load called without a compiler")

    monkeypatch.setattr(cpp_extension, "load", must_not_compile)
    with pytest.raises(BuildError, match=NO_COMPILER):
        _build.build("cpu", "cpu", _build.CPU_FLAGS, ["-fopenmp"])
    assert not list(tmp_path.rglob("*.so"))


# --------------------------------------------------------------------------------------------------
# Sources and cache location


def test_engine_files_are_the_folder_sources_and_headers():
    for folder, registration in (("cpu", "TORCH_LIBRARY_IMPL(swcli, CPU"), ("cuda", "TORCH_LIBRARY_IMPL(swcli, CUDA")):
        files = _build.engine_files(folder)
        expected = sorted(f for f in (REPO / "kernels" / folder).iterdir() if f.suffix in (".cpp", ".cu", ".h", ".cuh"))
        assert files == expected
        assert any(registration in f.read_text() for f in files)
    assert any(f.suffix == ".cu" for f in _build.engine_files("cuda"))


def test_every_kernel_source_and_header_is_packaged():
    """An installed (not editable) swcli compiles from the package's copy of kernels/: a source or header
    that package-data leaves out breaks the build there, while the checkout still builds."""
    tomllib = pytest.importorskip("tomllib")
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = settings["package-data"]["swcli.kernels"]
    assert settings["package-dir"]["swcli.kernels"] == "kernels"
    files = {f for f in (REPO / "kernels").rglob("*") if f.suffix in _build.SOURCE_SUFFIXES + _build.HEADER_SUFFIXES}
    assert {f.parent.name for f in files} >= {"cpu", "cuda", "host"}
    packaged = {f for pattern in patterns for f in (REPO / "kernels").glob(pattern)}  # setuptools' globs
    assert sorted(str(f.relative_to(REPO)) for f in files - packaged) == []


def test_engine_files_of_a_missing_folder_is_a_build_error():
    with pytest.raises(BuildError, match="no_such_engine"):
        _build.engine_files("no_such_engine")


def test_an_edited_header_changes_the_module_name(fake_build, tmp_path, monkeypatch):
    folder = tmp_path / "kernels" / "toy"
    folder.mkdir(parents=True)
    (folder / "a.cpp").write_text('#include "a.h"\n')
    (folder / "a.h").write_text("// one\n")
    monkeypatch.setattr(_build, "packaged_folder", lambda _kernels, name: tmp_path / "kernels" / name)
    first = _build.build("toy", "toy", ["-O3"], [])
    (folder / "a.h").write_text("// two\n")
    second = _build.build("toy", "toy", ["-O3"], [])
    assert first.name != second.name
    assert fake_build.calls[0]["sources"] == [str(folder / "a.cpp")]  # headers are hashed, not compiled


def test_cache_root_honours_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _build.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("SWCLI_CACHE_DIR")
    assert _build.cache_root() == tmp_path / "xdg" / "swcli"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _build.cache_root() == tmp_path / "home" / ".cache" / "swcli"


# --------------------------------------------------------------------------------------------------
# build(): naming, message, error wrapping (with cpp_extension.load faked)


class FakeLoad:
    """cpp_extension.load: records each call and the build directory's files at that time, and writes a
    whole shared library where the real build would (or raises `error`)."""

    def __init__(self, error=None):
        self.calls = []
        self.files_seen = []
        self.error = error

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        build_dir = Path(kwargs["build_directory"])
        self.files_seen.append(sorted(p.name for p in build_dir.iterdir()))
        if self.error is not None:
            raise self.error
        shutil.copyfile(A_SHARED_LIBRARY, build_dir / f"{kwargs['name']}.so")
        return None  # is_python_module=False: the library is loaded, nothing returned


class FakeLoadLibrary:
    """_build._load_library: records the libraries loaded directly from the cache; raises errors[k] at
    call k where given."""

    def __init__(self):
        self.loaded = []
        self.errors = {}

    def __call__(self, library):
        self.loaded.append(library)
        if len(self.loaded) - 1 in self.errors:
            raise self.errors[len(self.loaded) - 1]


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    fake = FakeLoad()
    fake.load_library = FakeLoadLibrary()
    monkeypatch.setattr(cpp_extension, "load", fake)
    monkeypatch.setattr(_build, "_load_library", fake.load_library)
    return fake


def test_build_names_and_places_the_module_by_content(fake_build, tmp_path, capsys):
    first = _build.build("cpu", "cpu", ["-O3"], [])
    again = _build.build("cpu", "cpu", ["-O3"], [])
    other_flags = _build.build("cpu", "cpu", ["-O2"], [])
    assert first.name == again.name
    assert first.name != other_flags.name
    assert first.name.startswith("swcli_cpu_") and len(first.name) == len("swcli_cpu_") + 16
    call = fake_build.calls[0]
    assert Path(call["build_directory"]) == tmp_path / first.name
    assert Path(call["build_directory"]).is_dir()
    assert first.library == tmp_path / first.name / f"{first.name}.so"
    assert call["sources"] == [str(f) for f in _build.engine_files("cpu") if f.suffix == ".cpp"]
    assert call["is_python_module"] is False
    assert call["extra_cflags"] == ["-O3"]


def test_first_compile_prints_one_line(fake_build, tmp_path, capsys):
    engine = _build.build("cpu", "cpu", ["-O3"], [])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "compiling the cpu engine" in lines[0]
    assert str(tmp_path / engine.name) in lines[0]
    # once the binary exists, loading is silent, and loads it directly (no compiler, no ninja)
    assert engine.library.is_file()
    _build.build("cpu", "cpu", ["-O3"], [])
    assert capsys.readouterr().err == ""
    assert len(fake_build.calls) == 1 and fake_build.load_library.loaded == [engine.library]


def test_build_failure_is_a_build_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpp_extension, "load", FakeLoad(RuntimeError("Error building extension 'x'")))
    with pytest.raises(BuildError, match=r"building the cpu engine in .* failed: Error building"):
        _build.build("cpu", "cpu", ["-O3"], [])


NINJA_FAILURE = """Error building extension 'swcli_cpu_x': [1/4] c++ -MMD -MF ops.o.d -fPIC -O3 -c ops.cpp -o ops.o
FAILED: ops.o
c++ -MMD -MF ops.o.d -fPIC -O3 -c /src/ops.cpp -o ops.o
In file included from /src/ops.cpp:3:
/src/ops.cpp:12:3: error: expected ';' before 'return'
   12 |   return x
      |   ^~~~~~
/src/ops.cpp:20:1: error: a second error
ninja: build stopped: subcommand failed.
"""


def test_build_failure_is_one_line_with_the_first_error_and_a_log(monkeypatch, tmp_path):
    # ninja's error is the whole build output; the CLI prints a BuildError as one line
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpp_extension, "load", FakeLoad(RuntimeError(NINJA_FAILURE)))
    with pytest.raises(BuildError) as info:
        _build.build("cpu", "cpu", ["-O3"], [])
    message = str(info.value)
    assert "\n" not in message
    assert "failed: /src/ops.cpp:12:3: error: expected ';' before 'return'" in message
    assert "C++ compiler 'c++' = " in message
    (log,) = tmp_path.glob("*/build.log")
    assert f"full log: {log}" in message and log.read_text().strip() == NINJA_FAILURE.strip()


def test_a_failing_compiler_probe_in_torch_is_a_one_line_build_error(monkeypatch, tmp_path):
    # torch probes the compiler with `CXX -v` and lets CalledProcessError escape: a traceback before
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    probe = subprocess.CalledProcessError(1, ["c++", "-v"], output=b"c++: error: unrecognized option\n")
    monkeypatch.setattr(cpp_extension, "load", FakeLoad(probe))
    with pytest.raises(BuildError, match=r"^building the cpu engine in .* failed: c\+\+: error: unrecognized "
                                         r"option \(C\+\+ compiler 'c\+\+' = [^\n]*\)$"):
        _build.build("cpu", "cpu", ["-O3"], [])


@pytest.mark.parametrize("script", [None, 'echo "cc1plus: fatal error: this compiler is broken" >&2; exit 1'])
def test_a_compiler_that_does_not_run_is_one_line(monkeypatch, tmp_path, script):
    # CXX=false (a compiler that fails): 82 lines of traceback from torch's compiler probe before
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path / "cache"))
    compiler = "false" if script is None else compiler_script(tmp_path, "broken-c++", script)
    monkeypatch.setenv("CXX", compiler)
    with pytest.raises(BuildError) as info:
        _build.build("cpu", "cpu", ["-O3"], [])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"the C++ compiler '{compiler}' (") and "does not work" in message
    if script is not None:
        assert message.endswith("exited with status 1: cc1plus: fatal error: this compiler is broken; "
                                "set CXX to a working C++ compiler")
    assert not list(tmp_path.rglob("*.so"))


# --------------------------------------------------------------------------------------------------
# The compiler in the cache key; a built engine without a compiler


def test_the_compiler_is_part_of_the_cache_key(fake_build, tmp_path, monkeypatch, capsys):
    first = _build.build("cpu", "cpu", ["-O3"], [])
    assert _build.build("cpu", "cpu", ["-O3"], []).name == first.name  # same compiler: the same build
    capsys.readouterr()
    other = compiler_script(tmp_path, "other-c++", 'exec c++ "$@"')
    monkeypatch.setenv("CXX", other)
    second = _build.build("cpu", "cpu", ["-O3"], [])
    assert second.name != first.name and second.name.startswith(first.name[:-6])  # same sources and flags
    assert "compiling the cpu engine" in capsys.readouterr().err  # a new build says so
    assert len(fake_build.calls) == 2
    Path(other).write_text(Path(other).read_text() + "# upgraded\n")  # the same path, another file
    assert _build.build("cpu", "cpu", ["-O3"], []).name not in (first.name, second.name)


def test_a_built_engine_loads_without_a_compiler(fake_build, monkeypatch, capsys):
    first = _build.build("cpu", "cpu", ["-O3"], [])
    capsys.readouterr()
    monkeypatch.setenv("CXX", NO_COMPILER)
    again = _build.build("cpu", "cpu", ["-O3"], [])
    assert again == first and capsys.readouterr().err == ""
    assert len(fake_build.calls) == 1 and fake_build.load_library.loaded == [first.library]
    with pytest.raises(BuildError, match=NO_COMPILER):  # nothing built with these flags: the clear error
        _build.build("cpu", "cpu", ["-O2"], [])


def test_without_a_compiler_the_newest_whole_build_is_loaded(fake_build, tmp_path, monkeypatch):
    first = _build.build("cpu", "cpu", ["-O3"], [])
    monkeypatch.setenv("CXX", compiler_script(tmp_path, "other-c++", 'exec c++ "$@"'))
    second = _build.build("cpu", "cpu", ["-O3"], [])
    os.utime(first.library, (1, 1))  # the older one
    monkeypatch.setenv("CXX", NO_COMPILER)
    assert _build.build("cpu", "cpu", ["-O3"], []).name == second.name
    second.library.write_bytes(b"\x7fELF cut short")
    assert _build.build("cpu", "cpu", ["-O3"], []).name == first.name


# --------------------------------------------------------------------------------------------------
# A broken library in the cache


@pytest.mark.parametrize("size", [0, 10, 63, 100, 1000, 0.9])  # 0.9: the first 90% of the file
def test_library_problem_finds_truncated_libraries(tmp_path, size):
    whole = A_SHARED_LIBRARY.read_bytes()
    assert _build._library_problem(A_SHARED_LIBRARY) is None
    cut = tmp_path / "cut.so"
    cut.write_bytes(whole[:int(size * len(whole)) if isinstance(size, float) else size])
    assert "file too short" in _build._library_problem(cut)
    text = tmp_path / "text.so"
    text.write_text("not a library, but long enough to hold an ELF header: " + "x" * 100)
    assert _build._library_problem(text) is not None


def test_a_truncated_library_is_rebuilt_once(fake_build, tmp_path, capsys):
    # before: ninja's log called the library up to date, and every run failed to load it ("file too short")
    engine = _build.build("cpu", "cpu", ["-O3"], [])
    build_dir = engine.library.parent
    (build_dir / ".ninja_log").write_text("# ninja log v5\n1\t2\t0\tswcli_cpu.so\t0\n")
    (build_dir / "ops.o").write_bytes(b"object")
    engine.library.write_bytes(A_SHARED_LIBRARY.read_bytes()[:1000])
    capsys.readouterr()
    again = _build.build("cpu", "cpu", ["-O3"], [])
    err = capsys.readouterr().err
    assert again == engine and len(fake_build.calls) == 2
    assert fake_build.files_seen[1] == []  # the outputs were removed: everything is compiled again
    lines = err.splitlines()
    assert len(lines) == 1 and "compiling the cpu engine again (the cached library was unreadable: file " \
                               "too short" in lines[0]
    assert _build._library_problem(engine.library) is None
    assert fake_build.load_library.loaded == []  # the truncated one was never handed to the loader


def test_a_library_that_fails_to_load_is_rebuilt_once(fake_build, capsys):
    engine = _build.build("cpu", "cpu", ["-O3"], [])
    fake_build.load_library.errors[0] = OSError(f"{engine.library}: undefined symbol: _ZN2at4zero")
    capsys.readouterr()
    assert _build.build("cpu", "cpu", ["-O3"], []) == engine
    assert len(fake_build.calls) == 2
    assert "compiling the cpu engine again (the cached library was unreadable: " in capsys.readouterr().err


def test_a_broken_library_whose_rebuild_fails_is_a_clear_error(fake_build, monkeypatch):
    engine = _build.build("cpu", "cpu", ["-O3"], [])
    engine.library.write_bytes(b"")
    fake_build.error = RuntimeError(NINJA_FAILURE)
    with pytest.raises(BuildError) as info:
        _build.build("cpu", "cpu", ["-O3"], [])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"the cpu engine cached in {engine.library.parent} was unreadable (file too short")
    assert "and rebuilding it failed: /src/ops.cpp:12:3: error: expected ';'" in message


def test_build_removes_a_stale_torch_lock(fake_build, tmp_path):
    first = _build.build("cpu", "cpu", ["-O3"], [])
    lock = tmp_path / first.name / "lock"
    lock.write_text("")
    _build.build("cpu", "cpu", ["-O3"], [])
    assert not lock.exists()


# --------------------------------------------------------------------------------------------------
# Stale locks


def test_remove_stale_torch_lock(tmp_path):
    (tmp_path / "lock").write_text("")
    (tmp_path / "build.ninja").write_text("keep me")
    _build._remove_stale_torch_lock(tmp_path)
    assert not (tmp_path / "lock").exists()
    assert (tmp_path / "build.ninja").read_text() == "keep me"
    _build._remove_stale_torch_lock(tmp_path)  # no lock: nothing to do, no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.ninja"]


# --------------------------------------------------------------------------------------------------
# The real engine (from the cache)


def test_cpu_engine_is_cached_in_process():
    import swcli.ops  # noqa: F401  the operators' schemas (the engine registers their kernels only)

    first = _build.cpu_engine()
    assert _build.cpu_engine() is first
    assert first.library.is_file()
    assert torch.ops.swcli.scores(torch.zeros(1, 2, 2), None, None, -1.0, 1.0).shape == (1,)


def test_cpu_engine_lives_in_the_cache():
    engine = _build.cpu_engine()
    build_dir = engine.library.resolve().parent
    assert build_dir.name == engine.name
    assert build_dir.parent == _build.cache_root().resolve()
    assert engine.name.startswith("swcli_cpu_")


def _load_engine_in_subprocess(cache_dir: Path, timeout: float, disable_recovery: bool = False, **env):
    code = "from swcli import _build\n"
    if disable_recovery:
        code += "_build._remove_stale_torch_lock = lambda build_dir: None\n"
    code += "print(_build.cpu_engine().name)\n"
    env = dict(os.environ, SWCLI_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, timeout=timeout,
                          capture_output=True, text=True)


def _copy_of_the_real_build(tmp_path: Path) -> Path:
    """A copy of the real cpu engine's build directory in tmp_path (a cache of its own)."""
    build_dir = _build.cpu_engine().library.resolve().parent
    copy = tmp_path / build_dir.name
    shutil.copytree(build_dir, copy)
    return copy


def test_stale_lock_is_recovered_not_a_hang(tmp_path):
    # A torch FileBaton `lock` left in a build directory, as a killed compile leaves it, with the
    # library not linked yet: a fresh subprocess goes through build() and cpp_extension.load on that
    # directory (ninja links the objects left there) instead of waiting for ever.
    engine = _build.cpu_engine()
    build_dir = _copy_of_the_real_build(tmp_path)
    (build_dir / f"{engine.name}.so").unlink()
    lock = build_dir / "lock"
    lock.write_text("")
    proc = _load_engine_in_subprocess(tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == engine.name
    assert not lock.exists()
    assert _build._library_problem(build_dir / f"{engine.name}.so") is None


def test_the_real_engine_loads_without_a_compiler(tmp_path):
    # before: cpp_extension.load probed $CXX on every load, so CXX=/nonexistent failed with the engine built
    engine = _build.cpu_engine()
    _copy_of_the_real_build(tmp_path)
    proc = _load_engine_in_subprocess(tmp_path, timeout=120, CXX="/nonexistent")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == engine.name and proc.stderr == ""


def test_a_truncated_real_library_is_rebuilt(tmp_path):
    # A library cut short while ninja's log calls it up to date: before, every run failed ("file too
    # short") or died of SIGBUS; now it is detected, rebuilt once (a real compile, ~15-40 s), and loads.
    engine = _build.cpu_engine()
    build_dir = _copy_of_the_real_build(tmp_path)
    library = build_dir / f"{engine.name}.so"
    library.write_bytes(library.read_bytes()[:1000])
    proc = _load_engine_in_subprocess(tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == engine.name
    assert proc.stderr.count("compiling the cpu engine again (the cached library was unreadable: file too "
                             "short") == 1, proc.stderr
    assert _build._library_problem(library) is None


def test_stale_lock_would_hang_without_recovery(tmp_path):
    # The scenario above is real: with the recovery disabled, torch's FileBaton waits on the lock for
    # ever (it waits before it even looks for a binary, so an empty cache directory shows it).
    name = _build.cpu_engine().name
    (tmp_path / name).mkdir()
    lock = tmp_path / name / "lock"
    lock.write_text("")
    with pytest.raises(subprocess.TimeoutExpired):
        _load_engine_in_subprocess(tmp_path, timeout=8, disable_recovery=True)
    assert lock.exists()
    assert not list(tmp_path.rglob("*.so"))


def test_unwritable_cache_is_a_build_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(BuildError, match="cannot use the kernel cache.*SWCLI_CACHE_DIR"):
        _build.build("cpu", "cpu", _build.CPU_FLAGS, ["-fopenmp"])


def test_a_second_process_says_it_waits_for_a_running_build():
    # Hold the build lock as a compiling process would; another process must say it waits, then go on.
    import fcntl
    import select

    engine = _build.cpu_engine()
    cache = engine.library.resolve().parent.parent
    env = dict(os.environ, SWCLI_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    with open(cache / f"{engine.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-c", "from swcli import _build; _build.cpu_engine()"],
                                cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([proc.stderr], [], [], 60)  # no message must not hang the test
            first_line = proc.stderr.readline() if ready else ""
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    _, rest = proc.communicate(timeout=120)
    assert "waiting for another process that is compiling the cpu engine" in first_line
    assert proc.returncode == 0, rest
