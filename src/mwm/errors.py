"""The package's one user-facing error type, imported by the modules that raise it (``config``,
``paths``) without importing each other."""


class ConfigError(ValueError):
    """A config that does not validate; the message names file, key and value."""
