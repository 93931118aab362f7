"""Retry with backoff: the one wrapper every backend that talks to a server uses
(the S3 blob store, the PostgreSQL metadata store), as restic's backend/retry.

An operation is tried again while it fails for a reason the backend calls retryable
(a dropped connection, a 503, a server that stopped answering), with exponential
backoff (50 ms doubling to at most 2 s, each delay jittered by x0.5..1.5 so that many
clients do not retry in step), until $AGENTCAS_RETRY_SECONDS (default 20 s) have
passed since the first try; then the backend's "unavailable" error is raised, saying
how many tries were made and how long they took, from the start of the first one
(connecting included) and rounded up, so the message never says less than the caller
waited. A retryable failure that no retry can fix (a wrong password) ends the retries
at once.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import TypeVar

from agentcas.cas import settings

T = TypeVar("T")
DEFAULT_RETRY_SECONDS = 20.0
FIRST_DELAY = 0.05
MAX_DELAY = 2.0


def retry_seconds() -> float:
    """How long a failing request is retried before the service is called unavailable."""
    return settings.number("AGENTCAS_RETRY_SECONDS", DEFAULT_RETRY_SECONDS)


class Retry:
    """The tries of one operation: when it began, how many so far, when to give up."""

    def __init__(self, began: float | None = None):
        self.began = time.monotonic() if began is None else began
        self.deadline = self.began + retry_seconds()
        self.tries = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def summary(self) -> str:
        """"after 3 tries in 21s": the seconds since the first try began, rounded up."""
        return f"after {self.tries} {'try' if self.tries == 1 else 'tries'} in {math.ceil(self.elapsed)}s"

    def call(self, attempt: Callable[[], T], retryable: Callable[[BaseException], bool],
             unavailable: Callable[[BaseException, Retry], Exception],
             final: Callable[[BaseException], bool] = lambda exc: False) -> T:
        """attempt() until it returns, retried while it raises a `retryable` exception.

        A failure that is not retryable propagates as it is; a retryable one that is
        `final`, or that happens after the deadline, raises `unavailable(exc, self)`.
        """
        while True:
            self.tries += 1
            try:
                return attempt()
            except Exception as exc:  # noqa: BLE001 - classified by the backend
                if not retryable(exc):
                    raise
                if final(exc) or time.monotonic() >= self.deadline:
                    raise unavailable(exc, self) from None
                self.backoff()

    def backoff(self) -> None:
        """Sleep before the next try (never past the deadline)."""
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (self.tries - 1)) * (0.5 + random.random())
        time.sleep(max(0.0, min(delay, self.deadline - time.monotonic())))
