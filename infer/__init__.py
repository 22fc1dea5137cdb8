"""cnninfer: a GPU inference engine for the ECE408 CNN (PyCUDA), with a NumPy CPU backend."""
__version__ = "0.1.0"
