"""A config as the documents of other cluster engines: an sbatch script for Slurm, manifests
for Kubernetes. Every task still starts through `tfdist launch`, so it gets the same TF_CONFIG,
checks and supervision as on this machine.

Takes: a validated `Config` and the user's command. Gives: text to submit (`sbatch`, `kubectl
apply`), pure functions of their arguments. Never imports: TensorFlow, `training`, `cli`.
"""
