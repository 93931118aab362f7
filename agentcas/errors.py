"""The one error base class; the CLI maps its exit codes.

Specific errors live next to the code that raises them and subclass one of the
four kinds below, so the exit code follows from what went wrong, not from where.
"""


class AgentcasError(Exception):
    """Something a user can cause: printed as one line, never as a traceback."""

    exit_code = 1


class UsageError(AgentcasError):
    """The request itself is malformed (bad revision syntax, bad name, bad number)."""

    exit_code = 2


class ConflictError(AgentcasError):
    """A compare-and-swap lost, or the target already exists."""

    exit_code = 3


class IntegrityError(AgentcasError):
    """Stored or received bytes do not match their id, or a trust check failed."""

    exit_code = 4


class NotFound(AgentcasError):
    """A revision, thread or object the user named does not exist."""

    exit_code = 1
