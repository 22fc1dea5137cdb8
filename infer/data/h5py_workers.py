"""Processes reading through h5py, for the layouts only h5py reads (chunks never written,
HDF5's szip, n-bit and scale-offset filters): h5py serializes every call in a process on
one lock, so reading in parallel takes processes. Workers are plain `python -m infer.data.h5py_workers`
children talking pickle over pipes (multiprocessing's spawn would import the caller's main script
again; fork is unsafe beside reader threads inside HDF5). Each keeps the files it opened; a Workers
belongs to one open dataset and ends with it."""
import os
import pickle
import queue
import subprocess
import sys
import threading

import numpy as np

MAX_WORKERS = 8  # at most; one per core


class WorkerDied(Exception):
    pass


class Workers:
    def __init__(self, count=None):
        self.count = count or max(1, min(MAX_WORKERS, os.cpu_count() or 1))
        self.idle, self.all = queue.Queue(), []
        self._lock = threading.Lock()

    def _worker(self):
        """An idle worker, started on first need, or in place of one that died."""
        while True:
            with self._lock:
                if len(self.all) < self.count and self.idle.empty():
                    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder holding this infer package
                    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
                    p = subprocess.Popen([sys.executable, "-m", "infer.data.h5py_workers"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=path))
                    self.all.append(p)
                    return p
            try:
                return self.idle.get(timeout=0.2)
            except queue.Empty:
                pass

    def read(self, path, name, lo, hi, dtype):
        """Rows [lo, hi) of dataset `name` of file `path`, in dtype, read by a worker: (rows, its pid).
        An error there is re-raised here as an OSError with its message."""
        p = self._worker()
        try:
            pickle.dump((str(path), name, lo, hi, np.dtype(dtype).str), p.stdin)
            p.stdin.flush()
            status, value, pid = pickle.load(p.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            p.kill()
            with self._lock:
                self.all.remove(p)
            p.wait()
            raise WorkerDied(f"worker {p.pid} ended") from None
        self.idle.put(p)
        if status != "ok":
            raise OSError(value)
        return value, pid

    def close(self):
        for p in self.all:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.all:
            p.wait()
            p.stdout.close()
        self.all = []


def serve():
    """The worker's loop: requests from stdin, answers to stdout, until stdin closes."""
    import h5py

    try:
        import hdf5plugin  # noqa: F401  (registers its filters, as the parent did)
    except ImportError:
        pass
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers
    files = {}
    while True:
        try:
            path, name, lo, hi, dtype = pickle.load(requests)
        except EOFError:
            return
        try:
            f = files.get(path) or files.setdefault(path, h5py.File(path, "r"))
            ds = f[name]
            out = np.empty((hi - lo,) + ds.shape[1:], dtype)
            ds.read_direct(out, np.s_[lo:hi])
            answer = ("ok", out, os.getpid())
        except Exception as e:  # h5py raises OSError, ValueError... on damaged files
            answer = ("error", " ".join(str(e).split()) or type(e).__name__, os.getpid())
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    serve()
