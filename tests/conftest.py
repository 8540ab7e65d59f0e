"""Fixtures and settings shared by the whole suite: the tiny test model (written once per run),
the recording tool pair, and the kernel set the engine's tests run on.

The engine's tests run on the exact reference kernel set unless a test names another: the
oracle, chunk-invariance and bit-exact resume tests are about the reference's arithmetic, and a
user's default on the CPU (the fast set) has its own tests (tests/engine/test_fast_cpu.py), which
pick it with device.forced_kernel_set. Set here, at import, so that every pytest-xdist worker and
every subprocess a test starts inherits it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ds4agent.engine.device import KERNELS_ENV
from tests.support.rec_tool import RecTool

os.environ.setdefault(KERNELS_ENV, "reference")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny DS4-architecture test model (real vocabulary, random weights, seed 0): written once
    for the whole run; tests only read it."""
    from ds4agent.testmodels import make_test_model

    return make_test_model(tmp_path_factory.mktemp("model") / "tiny.gguf", config="tiny", seed=0)


@pytest.fixture
def tools():
    return [RecTool("alpha", "A1\n"), RecTool("beta", "B1\n")]
