"""`import cnninfer`: the Python API of the cnninfer package (installed as the `infer` package).

    import cnninfer
    with cnninfer.Session("model.hdf5") as s:
        labels = s.predict(images)
"""
from infer import __version__  # noqa: F401
from infer.errors import ForkedSession, InputError  # noqa: F401
from infer.session import Session  # noqa: F401
