"""User-facing errors of the CLI."""


class UserError(Exception):
    """Bad input: printed as one line `stoke: error: ...`, exit code 2.

    The message names the file, the field and the fix.
    """
