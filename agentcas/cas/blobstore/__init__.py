"""Blob stores: immutable framed objects by raw 32-byte id (interface in base.py, one file per backend)."""
