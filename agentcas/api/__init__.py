"""The group objects of `agentcas.Store` (threads, history, checkpoints, gc, trust, remotes)
and their typed results (`agentcas.api.results`). See agentcas/repository.py."""

from collections.abc import Callable

# A long command's progress callback: told (done, total) as it goes.
Progress = Callable[[int, int], None]
