"""This machine, below every room that uses it: facts and measurements (CPU features, GPUs,
which precision trains faster here), free ports, and how a child process is started. Imports
nothing of tfdist's above it."""
