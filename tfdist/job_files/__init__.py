"""A config as the documents of other cluster engines: an sbatch script for Slurm, manifests
for Kubernetes. Every task still starts through `tfdist launch`, so it gets the same TF_CONFIG,
checks and supervision as on this machine."""
