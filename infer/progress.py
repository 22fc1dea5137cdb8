"""A progress bar on stderr for long runs, and its silent stand-in."""
import sys
import threading
import time


class Progress:
    """A progress bar on stderr, shown once a run has taken 2 s, only when stderr is a terminal."""
    DELAY_S = 2.0

    def __init__(self, total, enabled=True):
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()  # several GPUs' threads report

    def update(self, count):
        with self.lock:
            self._update(count)

    def _update(self, count):
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.perf_counter() - self.t0 > self.DELAY_S:
            import click  # the terminal's bar: the only use of click outside the command line

            self.bar = click.progressbar(length=self.total, label="images", file=sys.stderr)
            self.bar.__enter__()
            self.bar.update(self.done)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def restart(self):
        """The run starts over (its images read another way): back to none done."""
        with self.lock:
            self.close()
            self.done = 0


class NoProgress:
    def update(self, count):
        pass

    def restart(self):
        pass

    def close(self):
        pass
