"""One inference run as a library call: a Session made, one evaluation, the session closed."""
from .session import Session

MIN_AGREEMENT = 0.9995  # share of predictions a GPU run must share with the NumPy reference


def run(data_path, model_path, n=None, backend="auto", notice=print, progress=False, scores=False, **options):
    """Classify the first n images of data_path (a path, or a list of shards taken as one data set)
    with the model; `options` go to the backend. Images that fit the host budget are read whole,
    then timed from host memory to labels in host memory; larger inputs stream from the files
    through a ring of buffers, and `forward` then includes the reading (timing read: the reader
    threads' mean busy time, wait: compute waiting for them)."""
    with Session(model_path, backend, notice=notice, **options) as session:
        return session.evaluate(data_path, n, scores=scores, progress=progress)
