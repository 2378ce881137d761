"""`tfdist launch`: a cluster planned as data (plan.py), then started and supervised
(supervisor.py)."""
