"""The bytes request bodies may hold at once (--max-buffered-mb).

HTTP bodies: a count all front ends share (SharedBytes), added to as each part of a body arrives,
so the bound is the server's whatever the kernel's spread of connections over front ends.

gRPC messages: a front end's own Budget. A call's message is let in (its stream's window opened
past HTTP/2's first 64 KiB, grpc_h2.Call.accept) only once the size its 5-byte prefix declares has
room; it is held until the call ends. Reads wait their turn in the order they asked, so a small
read never overtakes a large one. Reads wait for room (HTTP bodies are refused at once), and a
wait on a count shared over processes would need a wake-up across them: so this bound is a front
end's, and N front ends hold at most N budgets of gRPC messages.
"""
import asyncio
from collections import deque


class Budget:
    """`total` bytes, taken and given back by one event loop's tasks; takers wait first come,
    first served (a small read never overtakes a large one that waits)."""

    def __init__(self, total):
        self.total, self.held = total, 0
        self._waiting = deque()  # (bytes, future) in the order they asked

    def take_now(self, n):
        """Hold n bytes now if they fit and no one waits; whether it did."""
        if not self._waiting and self.held + n <= self.total:
            self.held += n
            return True
        return False

    async def take(self, n):
        """Wait until n bytes fit (n <= total), then hold them. Cancelled, it holds nothing."""
        if self.take_now(n):
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (n, granted)
        self._waiting.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted as it was cancelled
                self.give(n)
            else:
                if entry in self._waiting:  # (_wake drops it if it got there first)
                    self._waiting.remove(entry)
                self._wake()  # those behind it may fit now
            raise

    def give(self, n):
        """Give back n of the bytes held; the waiting reads that now fit go, in order."""
        self.held -= n
        self._wake()

    def _wake(self):
        while self._waiting:
            n, granted = self._waiting[0]
            if granted.done():  # cancelled while waiting
                self._waiting.popleft()
                continue
            if self.held + n > self.total:
                return
            self._waiting.popleft()
            self.held += n
            granted.set_result(None)


class SharedBytes:
    """Bytes held by the server's processes together: a multiprocessing Value("q") (its lock a POSIX
    semaphore, about a microsecond a step) given to each front end, or this process's own count
    where `value` is None (one process)."""

    def __init__(self, value=None):
        self._value, self._own = value, 0

    def add(self, n, limit):
        """Hold n more bytes if the total stays within limit; whether it did."""
        if self._value is None:
            if self._own + n > limit:
                return False
            self._own += n
            return True
        if not n:
            return True
        with self._value.get_lock():
            if self._value.value + n > limit:
                return False
            self._value.value += n
            return True

    def give(self, n):
        if self._value is None:
            self._own -= n
        elif n:
            with self._value.get_lock():
                self._value.value -= n

    @property
    def held(self):
        return self._own if self._value is None else self._value.value
