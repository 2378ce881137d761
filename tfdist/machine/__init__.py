"""This machine, below every room that uses it: facts and measurements (CPU features, GPUs,
which precision trains faster here), free ports, and how a child process is started.

Takes: nothing of tfdist's. Gives: `facts` (CPU, GPUs), `speed` and `precision` (what `auto`
picks, measured once and cached), `ports` (free, held), `children` (a child dies with its
parent), `preload` (Python tasks forked from one process that imported TensorFlow once),
`banners` (TensorFlow's start-up lines). Never imports: any room of tfdist but
`errors`.
"""
