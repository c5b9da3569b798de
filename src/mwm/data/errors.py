"""The one error type of the data stage."""

from __future__ import annotations

__all__ = ["DataError", "TokenizerError"]


class DataError(ValueError):
    """Bad input or a damaged output of the data stage; the message names file, key and value."""


class TokenizerError(DataError):
    """The GPT-2 BPE files could not be found, provisioned or verified."""
