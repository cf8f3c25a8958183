"""The torch mechanisms a prepared run is built from: set-and-restore contexts for torch's global
state, activation checkpointing, process groups and data-parallel wrappers, nested batches and the
loader cycle. Knobs apply themselves through these and `prepare()` assembles them; none of them names
a knob. Importing this package imports nothing; each module imports torch.
"""
