"""gc's defaults, in one place for the API (agentcas/api/gc.py, gc/) and the CLI, which shows them.

A module of constants beside errors.py: the CLI reads it for --help without loading gc.
"""

DEFAULT_GRACE = 3600               # keep objects written less than an hour ago
DEFAULT_GRACE_TEXT = "1h"
DEFAULT_EXPIRE_REFLOG = 90 * 86400  # expire reflog entries older than 90 days
DEFAULT_EXPIRE_REFLOG_TEXT = "90d"
DEFAULT_WAIT = 60.0                # how long a sweep waits for writes in progress
DEFAULT_WAIT_TEXT = "60s"
BATCH_DELETES = 10_000             # objects deleted per write transaction
