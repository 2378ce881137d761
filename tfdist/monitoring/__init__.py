"""Watching a cluster train: TensorBoard curves written once per run, throughput per task."""
