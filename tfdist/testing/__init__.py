"""Helpers for tests and benchmarks: local clusters of real processes on 127.0.0.1.

Takes: a config and a program. Gives: its processes, run to the end and killed by process
group whatever the outcome. Never imported by the library itself.
"""
