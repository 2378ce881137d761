"""Runnable examples that train real models on data shipped with a package.

A user's script: imports tfdist's public API only, as README's main job runs it.
"""
