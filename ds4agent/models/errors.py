"""Typed errors of the models room; `str(err)` is a complete message for the user."""

from __future__ import annotations


class ModelError(Exception):
    """Base class: a model cannot be found, does not fit, or cannot be downloaded."""


class ModelNotFoundError(ModelError):
    """No model file at the place the lookup order names (the message says what to run)."""


class PullError(ModelError):
    """A download failed or was refused (access, missing file, disk space, verification)."""
