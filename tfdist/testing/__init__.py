"""Helpers for tests and benchmarks: local clusters of real processes on 127.0.0.1."""
