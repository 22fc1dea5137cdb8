"""The bytes gRPC messages may hold at once in a front end (--max-buffered-mb), taken before a
message is read. gRPC's core grants a call's stream the flow-control window for its whole declared
message as soon as its handler reads, and the handler learns the message's size only once it is
complete, so a read takes the largest message's bytes (--max-body-mb), keeps the message's own
size once it has arrived, and gives that back as the call ends. Reads wait their turn in the order
they asked; a call not reading yet holds at most its stream's first window (64 KiB: the server
turns gRPC's window growth, BDP probing, off)."""
import asyncio
from collections import deque


class Budget:
    """`total` bytes, taken and given back by one event loop's tasks; takers wait first come,
    first served (a small read never overtakes a large one that waits)."""

    def __init__(self, total):
        self.total, self.held = total, 0
        self._waiting = deque()  # (bytes, future) in the order they asked

    async def take(self, n):
        """Wait until n bytes fit (n <= total), then hold them. Cancelled, it holds nothing."""
        if not self._waiting and self.held + n <= self.total:
            self.held += n
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
