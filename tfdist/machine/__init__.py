"""Facts about the machine this process runs on, and measurements of it: CPU features, GPUs,
and which precision trains faster here. Below every room that uses them; imports nothing of
tfdist's."""
