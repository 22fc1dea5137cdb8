"""A thread that owns what a CUDA context owns.

A CUDA context stays current in the thread that pushed it, and PyCUDA aborts the process when a
thread ends with a context still pushed ("The context stack was not empty upon module cleanup")
and warns when a CUDA object is freed on another thread ("out-of-thread context could not be
cleaned up"). So a GPU backend is made, used, closed and dropped on one `Home` thread. It is a
daemon thread that only `stop` ends: concurrent.futures' workers are stopped by the interpreter
before `atexit` runs, which ended them with the context still pushed.

`Holder` is what a Session owns apart from the Session itself, so that `weakref.finalize` can
release it when the Session is closed, dropped, or alive at interpreter exit; and in a process
forked from the one that made it, it refuses (the child has no thread and no CUDA context of
its own: CUDA does not survive fork).
"""
import ctypes
import os
import queue
import threading
import traceback
from concurrent.futures import Executor, Future

from ..errors import ForkedSession


class Home(Executor):
    """An executor of one daemon thread, whose jobs' references are dropped on that thread."""

    def __init__(self, name="cnninfer-session"):
        self._jobs = queue.SimpleQueue()
        self._stopped = False
        self.pid = os.getpid()
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=name, daemon=True)
        self._thread.start()
        self.ident = self._thread.ident

    def submit(self, fn, /, *args, **kwargs):
        if self._stopped:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def call(self, fn, *args):
        """fn(*args) on this thread, whoever calls (at once where the caller is this thread)."""
        if threading.get_ident() == self.ident:
            return fn(*args)
        return self.submit(fn, *args).result()

    def shutdown(self, wait=True, *, cancel_futures=False):
        """Run what was submitted, then end the thread (the jobs after it are refused)."""
        if self._stopped:
            return
        self._stopped = True
        self._jobs.put(None)
        if wait and threading.get_ident() != self.ident:
            self._thread.join()


def _serve(jobs):
    while True:
        job = jobs.get()
        if job is None:
            return
        future, fn, args, kwargs = job
        del job
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:
                _clear_locals(e)
                future.set_exception(e)
        del future, fn, args, kwargs  # what the job held is freed here, on the context's thread


def _clear_locals(error):
    """Drop the local variables of the frames an exception (and those it chains) carries, here:
    raised again on the caller's thread, their CUDA objects would be freed there."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


class Holder:
    """A Session's backend and the Home thread it lives on (None for the CPU backend)."""

    def __init__(self, home):
        self.home = home
        self.backend = None
        self.pid = os.getpid()

    @property
    def forked(self):
        return self.pid != os.getpid()

    def check(self):
        """ForkedSession in a process forked after this was made, where it holds a GPU thread."""
        if self.home is not None and self.forked:
            raise ForkedSession(f"this Session was made in process {self.pid}, and CUDA does not survive "
                                f"fork: make the Session in the child process (or start children with "
                                f"multiprocessing's 'spawn' method)")

    def call(self, fn, *args):
        self.check()
        return fn(*args) if self.home is None else self.home.call(fn, *args)

    def release(self):
        """Close the backend where it lives and end its thread; once, from close(), the garbage
        collector or interpreter exit (weakref.finalize). In a forked child the parent's CUDA
        objects are not the child's to free (freeing them would print PyCUDA's warnings): they are
        kept alive there, untouched, until the child exits."""
        box = [self.backend] if self.backend is not None else []
        self.backend = None
        if self.forked:
            for backend in box:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))
            return
        if self.home is None:
            for backend in box:
                backend.close()
            return
        if box:
            self.home.call(close_boxed, box)  # box's one reference goes on the home thread
        self.home.shutdown()


def close_boxed(box):
    """Close the one backend in the list `box` and drop the last reference to it, on this thread."""
    box.pop().close()
