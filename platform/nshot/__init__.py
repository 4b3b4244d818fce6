"""nshot: train, tune and serve few-, one- and zero-shot methods on Ray."""

__version__ = "0.1.0"
