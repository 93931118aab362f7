"""Helpers the tests share: real servers, session builders, the fork server for CLI runs."""
