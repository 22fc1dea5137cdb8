"""cnninfer: a GPU inference engine for the ECE408 CNN (PyCUDA), with a native C CPU backend.

The Python API is `Session` and `run` (see infer.session); importing the package needs no GPU."""
__version__ = "0.2.0"


def __getattr__(name):  # Session on first use: `import infer` stays instant for the command line
    if name in ("Session", "run"):
        from . import session

        return getattr(session, name)
    raise AttributeError(name)
