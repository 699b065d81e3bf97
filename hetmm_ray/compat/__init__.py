"""Shims that keep third-party imports working on every host."""
