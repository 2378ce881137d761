"""Watching a cluster train: TensorBoard curves written once per run, throughput per task,
where each worker's step time goes, the launcher's events, TensorBoard's own server.

Takes: a `Config` and a running fit (Keras callbacks), or a log folder. Gives: event files
(TensorBoard's own writers) and `tfdist tensorboard`'s server. Never imports: `training`,
`launch` or `cli` (they import it).
"""
