"""Runnable examples that train real models on data shipped with a package."""
