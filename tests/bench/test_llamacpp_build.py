"""Building llama.cpp's tools once: the toolchain check, the pinned sdist, extraction, the
install's layout, the lock, a build of your own. cmake is never run: `cmake_build` is faked."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from agent.bench import llamacpp_build as lb


def test_missing_toolchain_names_each_missing_part():
    assert lb.missing_toolchain(lambda name: None) == ["cmake", "a C compiler (cc, gcc or clang)",
                                                       "a C++ compiler (c++, g++ or clang++)"]
    assert lb.missing_toolchain(lambda name: "/usr/bin/x" if name in ("cmake", "clang", "clang++") else None) == []
    assert lb.missing_toolchain(lambda name: "/usr/bin/x" if name != "cmake" else None) == ["cmake"]


def test_ensure_without_a_toolchain_fails_before_any_download(tmp_path, monkeypatch):
    monkeypatch.setattr(lb, "fetch_sdist", lambda *a: pytest.fail("nothing is fetched without a toolchain"))
    with pytest.raises(lb.BuildError) as exc:
        lb.ensure_llama_cpp(tmp_path, which=lambda name: None if name == "cmake" else "/usr/bin/x")
    msg = str(exc.value)
    assert "\n" not in msg and "needs cmake," in msg and "apt-get install cmake build-essential" in msg
    assert "--llama-cpp DIR" in msg


def _sdist(path: Path, extra: dict[str, bytes] | None = None) -> str:
    files = {f"{lb.VENDOR}/CMakeLists.txt": b"project(x)", f"{lb.VENDOR}/convert_hf_to_gguf.py": b"print()",
             f"{lb.VENDOR}/gguf-py/gguf/__init__.py": b"", f"{lb.VENDOR}/conversion/__init__.py": b"",
             f"llama_cpp_python-{lb.VERSION}/llama_cpp/llama.py": b"not extracted", **(extra or {})}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fake_cmake(src: Path, jobs: int, log) -> Path:
    (src / "build" / "bin").mkdir(parents=True)
    for t in lb.TARGETS:
        (src / "build" / "bin" / t).write_text("#!/bin/sh\n")
    return src / "build"


@pytest.fixture
def pinned_sdist(tmp_path, monkeypatch):
    """A fake sdist placed where pip download would put it, its sha256 pinned."""
    scratch = tmp_path / "home" / "tools" / f".build-llama.cpp-{lb.VERSION}"
    scratch.mkdir(parents=True)
    monkeypatch.setattr(lb, "SDIST_SHA256", _sdist(scratch / lb.SDIST_NAME))
    return scratch


def test_build_once_installs_binaries_converter_and_build_json(pinned_sdist, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setattr(lb, "cmake_build", _fake_cmake)
    tools = lb.ensure_llama_cpp(home, which=lambda name: "/usr/bin/x", log=lambda line: None)
    assert tools.root == lb.tools_dir(home) and tools.bench.is_file() and tools.quantize.is_file()
    assert (tools.converter / "convert_hf_to_gguf.py").is_file() and (tools.converter / "gguf-py/gguf/__init__.py").is_file()
    info = json.loads((tools.root / "build.json").read_text())
    assert info["sdist_sha256"] == lb.SDIST_SHA256 and "-DBUILD_SHARED_LIBS=OFF" in info["cmake_flags"]
    assert not pinned_sdist.exists()  # the scratch tree is gone once the tools are in place
    # A second call uses what is there: no toolchain needed, nothing built.
    monkeypatch.setattr(lb, "cmake_build", lambda *a: pytest.fail("built twice"))
    assert lb.ensure_llama_cpp(home, which=lambda name: None).root == tools.root


def test_a_wrong_sdist_is_deleted_and_refused(pinned_sdist, tmp_path, monkeypatch):
    monkeypatch.setattr(lb, "SDIST_SHA256", "0" * 64)
    with pytest.raises(lb.BuildError, match="not the pinned"):
        lb.ensure_llama_cpp(tmp_path / "home", which=lambda name: "/usr/bin/x", log=lambda line: None)
    assert not (pinned_sdist / lb.SDIST_NAME).exists()
    assert not lb.tools_dir(tmp_path / "home").exists()


def test_extraction_takes_vendor_llama_cpp_only(tmp_path):
    sdist = tmp_path / lb.SDIST_NAME
    _sdist(sdist)
    lb.extract_vendor(sdist, tmp_path / "x")
    got = sorted(str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x").rglob("*") if p.is_file())
    assert got and all(g.startswith(lb.VENDOR + "/") for g in got)
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(lb.BuildError, match="not the expected sdist"):
        lb.extract_vendor(empty, tmp_path / "y")


def test_a_failed_build_step_says_what_failed_and_installs_nothing(pinned_sdist, tmp_path, monkeypatch):
    def failing(src, jobs, log):
        raise lb.BuildError("cmake build failed (exit 2):\nerror: no space left")

    monkeypatch.setattr(lb, "cmake_build", failing)
    with pytest.raises(lb.BuildError, match="cmake build failed"):
        lb.ensure_llama_cpp(tmp_path / "home", which=lambda name: "/usr/bin/x", log=lambda line: None)
    assert not lb.tools_dir(tmp_path / "home").exists()
    assert (pinned_sdist / ".extracted").is_file()  # the next run resumes from the extracted source


def test_run_step_times_out_and_reports_failures(tmp_path):
    with pytest.raises(lb.BuildError, match="did not finish in 0 s"):
        lb.run_step(["sleep", "5"], timeout=0.2, what="a slow step")
    with pytest.raises(lb.BuildError, match=r"a bad step failed \(exit 3\):\nboom"):
        lb.run_step(["sh", "-c", "echo boom >&2; exit 3"], timeout=10, what="a bad step")
    with pytest.raises(lb.BuildError, match="could not start"):
        lb.run_step([str(tmp_path / "nowhere")], timeout=10, what="a missing program")


def test_a_second_builder_waits_for_the_first(pinned_sdist, tmp_path, monkeypatch):
    """Two first uses at once: the second blocks on the lock and then finds the tools built."""
    entered, release = threading.Event(), threading.Event()
    builds = []

    def slow_cmake(src, jobs, log):
        builds.append(1)
        entered.set()
        release.wait(10)
        return _fake_cmake(src, jobs, log)

    monkeypatch.setattr(lb, "cmake_build", slow_cmake)
    home, lines = tmp_path / "home", []
    first = threading.Thread(target=lb.ensure_llama_cpp, args=(home,), kwargs={"which": lambda n: "/x", "log": lambda s: None})
    first.start()
    assert entered.wait(10)
    second: list[lb.LlamaCpp] = []
    t2 = threading.Thread(target=lambda: second.append(lb.ensure_llama_cpp(home, which=lambda n: "/x", log=lines.append)))
    t2.start()
    t2.join(0.5)
    assert t2.is_alive()  # waiting on the lock
    release.set()
    first.join(10)
    t2.join(10)
    assert builds == [1] and second and lb.is_complete(second[0].root)
    assert any("waiting for it" in line for line in lines)


def test_a_build_of_your_own(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(lb.BuildError, match="no bin/llama-bench"):
        lb.from_dir(tmp_path)
    for t in lb.TARGETS:
        (tmp_path / "bin" / t).write_text("")
    assert lb.from_dir(tmp_path).bench == tmp_path / "bin" / "llama-bench"
    assert lb.from_dir(tmp_path / "bin").root == tmp_path  # the bin directory itself is understood too


def test_x86_builds_leave_out_ggml_amx_path():
    """ggml's AMX matmul segfaults in every quantized prefill on this machine's CPU (llama.cpp #20824)."""
    x86 = lb.cmake_flags("x86_64")
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in x86
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in x86 and "-DGGML_NATIVE=ON" in x86
    assert not any("amx" in f for f in lb.cmake_flags("aarch64"))  # -mno-amx-* is an error off x86


def test_tools_built_with_other_flags_are_built_again(pinned_sdist, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setattr(lb, "cmake_build", _fake_cmake)
    tools = lb.ensure_llama_cpp(home, which=lambda name: "/usr/bin/x", log=lambda line: None)
    info = json.loads((tools.root / "build.json").read_text())
    (tools.root / "build.json").write_text(json.dumps({**info, "cmake_flags": list(lb.BASE_FLAGS)}))  # an AMX build
    assert not lb.is_complete(tools.root)
    (tools.root / "build.json").write_text("{not json")
    assert not lb.is_complete(tools.root)
