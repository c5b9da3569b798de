"""The package's user-facing error types, in one module every room can import without importing each
other: the entry points print their message instead of a traceback."""

__all__ = ["ConfigError", "DataError", "TokenizerError", "write_failure"]


class ConfigError(ValueError):
    """A config that does not validate; the message names file, key and value."""


class DataError(ValueError):
    """Bad input or a damaged output of the data stage; the message names file, key and value."""


class TokenizerError(DataError):
    """The GPT-2 BPE files could not be found, provisioned or verified."""


def write_failure(exc: OSError, what: str) -> str:
    """One line for an OS error while writing ``what`` (a read-only folder, a full disk): the OS's words,
    the file, and what to do; the entry points print it instead of a traceback."""
    where = f" ({exc.filename})" if exc.filename else ""
    return (f"cannot write {what}: {exc.strerror or exc}{where}; make the folder writable (and free space) "
            "or write elsewhere")
