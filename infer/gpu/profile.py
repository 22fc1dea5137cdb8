"""--profile: GPU time per kernel and per copy from CUDA events, plus the host-side set-up steps."""
from collections import defaultdict


class NullProfiler:
    """Profiling off: launches and copies record nothing."""

    def start(self, name, stream):
        pass

    def stop(self, name, stream):
        pass


class Profiler:
    def __init__(self):
        import pycuda.driver as cuda

        self.cuda = cuda
        self.reset()

    def reset(self):
        """Forget what was measured: the next rows() covers only what runs from now on."""
        self.open = {}
        self.events = []  # (name, start event, end event)
        self.host = {}  # name -> ms measured on the host clock

    def start(self, name, stream):
        ev = self.cuda.Event()
        ev.record(stream)
        self.open[(name, id(stream))] = ev

    def stop(self, name, stream):
        end = self.cuda.Event()
        end.record(stream)
        self.events.append((name, self.open.pop((name, id(stream))), end))

    def rows(self):
        """One row per kernel or copy: calls, total ms, mean us, share of the summed GPU time."""
        total, calls = defaultdict(float), defaultdict(int)
        for name, start, end in self.events:
            total[name] += end.time_since(start)
            calls[name] += 1
        gpu = sum(total.values()) or 1.0
        rows = [dict(name=name, calls=calls[name], total_ms=ms, mean_us=1e3 * ms / calls[name], share=ms / gpu)
                for name, ms in sorted(total.items(), key=lambda kv: -kv[1])]
        rows += [dict(name=name, calls=1, total_ms=ms, mean_us=1e3 * ms, share=None) for name, ms in self.host.items()]
        return rows


def table(rows):
    """The profile as aligned text lines."""
    lines = [f"{'GPU kernel / copy / host step':34} {'calls':>6} {'total ms':>10} {'mean us':>10} {'share':>7}"]
    for r in rows:
        share = f"{100 * r['share']:6.1f}%" if r["share"] is not None else "   host"
        lines.append(f"{r['name']:34} {r['calls']:6d} {r['total_ms']:10.3f} {r['mean_us']:10.1f} {share}")
    return lines
