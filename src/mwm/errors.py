"""The package's one user-facing error type, imported by the modules that raise it (``config``,
``paths``) without importing each other."""


class ConfigError(ValueError):
    """A config that does not validate; the message names file, key and value."""


def write_failure(exc: OSError, what: str) -> str:
    """One line for an OS error while writing ``what`` (a read-only folder, a full disk): the OS's words,
    the file, and what to do; the entry points print it instead of a traceback."""
    where = f" ({exc.filename})" if exc.filename else ""
    return (f"cannot write {what}: {exc.strerror or exc}{where}; make the folder writable (and free space) "
            "or write elsewhere")
