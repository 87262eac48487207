"""Sub-commands of the `dynnet` CLI (see dynnet_ros.cli)."""


class CommandError(Exception):
    """A user-facing failure: printed as one line by the CLI, exit status 2."""
