"""Metadata stores: refs with compare-and-swap, reflog, leases, trust, remotes, signatures
(interface in base.py, one file per backend)."""
