"""The folder `tfdist launch` puts first on the PYTHONPATH of the user's command: its
`sitecustomize` imports tfdist in a launched script that does not (`tfdist.launch.plan.SCRIPT_HOOK`)."""
