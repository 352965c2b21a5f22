"""Shared test setup: offline Hugging Face, a throwaway kb_gym cache, the ``gpu`` marker, ``official_dir()``.

The environment variables are set at import, before any test module imports ``datasets`` or
``kb_gym``, so no test waits on network retries and no test writes results or baselines to
``~/.cache``.
"""

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ["KB_GYM_CACHE"] = tempfile.mkdtemp(prefix="kb_gym_test_cache_")


def official_dir() -> Path:
    """The official KernelBench set (level_N.jsonl): KB_GYM_TEST_OFFICIAL, else ../shared/kernelbench.

    Skips the calling test when the folder is absent.
    """
    env = os.environ.get("KB_GYM_TEST_OFFICIAL")
    path = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "kernelbench"
    if not path.is_dir():
        pytest.skip(f"official KernelBench set not found at {path} (set KB_GYM_TEST_OFFICIAL)")
    return path


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # lazily: only when some test needs a GPU

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def official_path() -> Path:
    """``official_dir()`` as a fixture (skips when the set is absent)."""
    return official_dir()
