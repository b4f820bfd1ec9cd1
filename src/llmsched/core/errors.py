"""Errors a user can cause: the CLI prints them on one line and exits with code 2."""


class ConfigError(ValueError):
    """Invalid input (an option, a file, a workload) named in one sentence."""
