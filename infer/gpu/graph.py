"""CUDA graphs through the driver API (this PyCUDA has no stream capture): a batch's whole enqueue,
every chunk on every stream, recorded once and replayed with one launch, so a pipeline of many
small kernels costs no Python launch overhead. Set CNNINFER_GRAPHS=0 to launch kernel by kernel."""
import ctypes

from .. import env

CAPTURE_THREAD_LOCAL = 1  # other threads' CUDA calls (none do any) may not disturb a capture

_driver = None


class GraphError(RuntimeError):
    pass


def _lib():
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        p, pp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        for name, args in (("cuStreamBeginCapture_v2", [p, ctypes.c_int]), ("cuStreamEndCapture", [p, pp]),
                           ("cuGraphInstantiateWithFlags", [pp, p, ctypes.c_ulonglong]), ("cuGraphLaunch", [p, p]),
                           ("cuGraphExecDestroy", [p]), ("cuGraphDestroy", [p])):
            getattr(lib, name).argtypes, getattr(lib, name).restype = args, ctypes.c_int
        _driver = lib
    return _driver


def _check(rc, what):
    if rc:
        raise GraphError(f"{what} failed with CUDA error {rc}")


def enabled():
    return env.graphs()


class Graph:
    """start(), where given, enqueues work on `origin` before everything else; record() enqueues work
    on `origin` and on `others` (which fork from origin after start's work and join back), then
    finish(), where given, on origin after all of it; the graph replays all of it on origin."""

    def __init__(self, origin, others, record, finish=None, start=None):
        import pycuda.driver as cuda

        lib = _lib()
        handle = ctypes.c_void_p(origin.handle)
        _check(lib.cuStreamBeginCapture_v2(handle, CAPTURE_THREAD_LOCAL), "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        failed = None
        try:
            if start is not None:
                start()
            fork = cuda.Event(cuda.event_flags.DISABLE_TIMING)
            fork.record(origin)
            for s in others:
                s.wait_for_event(fork)
            record()
            for s in others:
                join = cuda.Event(cuda.event_flags.DISABLE_TIMING)
                join.record(s)
                origin.wait_for_event(join)
            if finish is not None:
                finish()
        except cuda.Error as e:  # the capture was invalidated (seen with two contexts on one GPU)
            failed = e
        finally:
            rc = lib.cuStreamEndCapture(handle, ctypes.byref(graph))
        if failed is not None:
            if graph:
                lib.cuGraphDestroy(graph)
            raise GraphError(f"stream capture failed: {failed}")
        _check(rc, "cuStreamEndCapture")
        self.exec = ctypes.c_void_p()
        try:
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), graph, 0), "cuGraphInstantiate")
        finally:
            lib.cuGraphDestroy(graph)

    def launch(self, stream):
        _check(_lib().cuGraphLaunch(self.exec, ctypes.c_void_p(stream.handle)), "cuGraphLaunch")

    def close(self):
        if self.exec:
            _lib().cuGraphExecDestroy(self.exec)
            self.exec = None
