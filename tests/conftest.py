import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import fakedata

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def one_thread():
    """Small batched matmuls: one thread (two on a busy 2-core machine are ~100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def tiny_config(tmp_path):
    """Factory for the tests' tiny configs: ``tiny_config(file="tiny.yaml", base=None, folder=None,
    **overrides)`` writes ``folder/file`` (``tmp_path`` by default) and returns its path.

    The config is ``fakedata.TINY`` (a 2-layer, 16-wide model trained 12 steps) unless ``base``
    gives another (a dict, or a YAML file such as config/ci.yaml). A test that depends on a
    setting passes it: ``train__max_iters=4`` sets one key, ``grid={...}`` updates a section,
    ``name="x"`` sets a top-level value (see ``fakedata.write_config``)."""

    def make(file="tiny.yaml", *, base=None, folder=None, **overrides):
        folder = tmp_path if folder is None else Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        return fakedata.write_config(folder / file, base=base, **overrides)

    return make
