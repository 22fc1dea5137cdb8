"""cnninfer: a GPU inference engine for the ECE408 CNN (PyCUDA), with a NumPy CPU backend.

The Python API is `Session` (see infer.session); importing the package needs no GPU."""
__version__ = "0.2.0"


def __getattr__(name):  # Session on first use: `import infer` stays instant for the command line
    if name == "Session":
        from .session import Session

        return Session
    raise AttributeError(name)
