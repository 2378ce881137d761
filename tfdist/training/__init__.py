"""Keras training under a strategy: the fit wrapper, data distribution, Keras workarounds."""
