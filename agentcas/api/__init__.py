"""The group objects of `agentcas.Store` (threads, history, checkpoints, gc, trust, remotes)
and their typed results (`agentcas.api.results`). See agentcas/repository.py."""
