"""Root test configuration.

Triton kernels are checked on CPU under the interpreter; the variable must be set before any
module that imports ``triton`` is loaded, so it is set here, at the top of the root conftest.
On a CUDA machine it is left alone so the kernels compile for real.
"""

import ctypes
import gc
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# ---- shared model fixtures (session-scoped; loading costs on 2 cores: loaded_model ~5 s,
# hf_oracle ~15 s, hf_tokenizer ~10 s; gguf_path needs PyPI only the first time) ----


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


_libc = ctypes.CDLL("libc.so.6")


@pytest.fixture(autouse=True)
def _return_memory_after_each_test():
    """Each engine touches its whole hot pool (32K tokens: ~1.5 GB fp32) and tests that patch an
    engine's methods leave reference cycles that the cyclic collector reaches only rarely; with
    glibc keeping freed arenas, the suite's footprint climbed past 19 GB of this 24 GB machine and
    CI was OOM-killed. Collecting and trimming after every test keeps it near one test's needs."""
    yield
    gc.collect()
    _libc.malloc_trim(0)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    """Path of the default model's GGUF file (pulled into the cache if missing)."""
    from services.decoder.model.model_store import pull_default_model

    return pull_default_model(progress=lambda _msg: None)


@pytest.fixture(scope="session")
def loaded_model(gguf_path):
    """Our ``LoadedModel`` for the default GGUF, fp32."""
    from services.decoder.model.loader import load_model

    return load_model(gguf_path, dtype=torch.float32)


def _offline_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


@pytest.fixture(scope="session")
def hf_oracle(gguf_path):
    """transformers' ``AutoModelForCausalLM`` for the same GGUF, fp32, eval mode, offline."""
    transformers = _offline_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path):
    """transformers' ``AutoTokenizer`` built from the same GGUF's metadata, offline.

    Note: its ``eos_token`` is ``<|im_start|>`` (a transformers GGUF-converter quirk); the model's
    real eos is id 2 ``<|im_end|>``, as in ``loaded_model.config.eos_token_ids``.
    """
    transformers = _offline_transformers()
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def llm(loaded_model):
    """Our in-process ``LLM`` on the default model (fp32, default engine settings)."""
    from dhisparse import LLM

    return LLM(loaded=loaded_model)
