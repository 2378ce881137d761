"""Helpers for your own tests and benchmarks (and tfdist's): what a process holds
(`held_beyond_weights`, public), and local clusters of real processes on 127.0.0.1
(`local_cluster`, tfdist's own tests').

Takes: a trained model; a config and a program. Gives: bytes held by device; processes run to
the end and killed by process group whatever the outcome. Never imported by the library itself.
"""

from tfdist.testing.memory import held_beyond_weights, held_variables

__all__ = ["held_beyond_weights", "held_variables"]
