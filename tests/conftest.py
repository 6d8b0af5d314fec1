"""Root test configuration.

Triton kernels are checked on CPU under the interpreter; the variable must be set before any
module that imports ``triton`` is loaded, so it is set here, at the top of the root conftest.
On a CUDA machine it is left alone so the kernels compile for real.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
