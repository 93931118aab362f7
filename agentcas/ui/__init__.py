"""`agentcas ui`: a read-only local web view of a store (lineage, threads, checkpoints, diffs,
replay, effects), a client of the public `Store` API like the CLI.

documents.py builds the JSON documents (the CLI's `--json` documents, paged), lineage_view.py
folds and lays out the fork tree, pages.py gathers what each HTML page shows, and server.py
serves them behind a token on a loopback address.
"""
