"""The `tfdist` command line."""
