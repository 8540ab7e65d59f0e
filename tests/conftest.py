"""Fixtures and settings shared by the whole suite.

The engine's tests run on the exact reference kernel set unless a test names another: the
oracle, chunk-invariance and bit-exact resume tests are about the reference's arithmetic, and a
user's default on the CPU (the fast set) has its own tests (tests/engine/test_fast_cpu.py), which
pick it with device.forced_kernel_set. Set here, at import, so that every pytest-xdist worker and
every subprocess a test starts inherits it.
"""

from __future__ import annotations

import os

from ds4agent.engine.device import KERNELS_ENV

os.environ.setdefault(KERNELS_ENV, "reference")
