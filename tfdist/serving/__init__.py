"""Inference: fast bulk prediction, request batching, an HTTP endpoint, SavedModel export."""
