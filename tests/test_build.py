"""The build cache (swcli/_build.py): toolchain, cache naming, first-compile message, errors, stale locks."""

# Stale-lock recovery: a build never hangs. Only the real-engine tests load the compiled CPU engine (from
# the cache; it compiles once, ~35 s, if the cache is cold). Everything else fakes cpp_extension.load, so
# nothing here compiles.

from __future__ import annotations

import os
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
    def __init__(self, error=None):
        self.calls = []
        self.error = error

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return None  # is_python_module=False: the library is loaded, nothing returned


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    fake = FakeLoad()
    monkeypatch.setattr(cpp_extension, "load", fake)
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
    # once the binary exists, loading is silent
    engine.library.write_bytes(b"")
    _build.build("cpu", "cpu", ["-O3"], [])
    assert capsys.readouterr().err == ""


def test_build_failure_is_a_build_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpp_extension, "load", FakeLoad(RuntimeError("Error building extension 'x'")))
    with pytest.raises(BuildError, match=r"building the cpu engine in .* failed: Error building"):
        _build.build("cpu", "cpu", ["-O3"], [])


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


def _load_engine_in_subprocess(cache_dir: Path, timeout: float, disable_recovery: bool = False):
    code = "from swcli import _build\n"
    if disable_recovery:
        code += "_build._remove_stale_torch_lock = lambda build_dir: None\n"
    code += "print(_build.cpu_engine().name)\n"
    env = dict(os.environ, SWCLI_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, timeout=timeout,
                          capture_output=True, text=True)


def test_stale_lock_is_recovered_not_a_hang():
    # A torch FileBaton `lock` left in the real cpu engine's build directory, as a killed compile
    # leaves it. A fresh subprocess has its own empty cpu_engine cache, so it really goes through
    # build() and cpp_extension.load on that directory.
    engine = _build.cpu_engine()
    build_dir = engine.library.resolve().parent
    lock = build_dir / "lock"
    lock.write_text("")
    try:
        proc = _load_engine_in_subprocess(build_dir.parent, timeout=120)
        lock_left = lock.exists()
    finally:
        if lock.exists():
            lock.unlink()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == engine.name
    assert "compiling" not in proc.stderr  # the cached binary was reused, not rebuilt
    assert not lock_left


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
