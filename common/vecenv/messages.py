"""Length-prefixed messages over one end of a socketpair (what multiprocessing.Pipe builds on Unix).

Raw reads and writes with one read per message in the common case: about half the cost of
multiprocessing.Connection, which matters when a whole CartPole step costs a few microseconds. The worker reads with
blocking `recv`; the parent only reads what is there (`pump`), so no read can outlast a bound. A large message is read
straight into a buffer of its own size and sent without a copy, so it costs what copying it costs.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import time

_HEADER = struct.Struct("!Q")
_LARGE = 1 << 20  # a message at least this large gets a buffer of its own


class Channel:
    """One end of a socketpair, carrying whole messages (bytes) both ways."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fd = sock.fileno()
        self._buffer = bytearray()  # bytes read that are not yet a whole message
        self._body: bytearray | None = None  # a large message being read, and how much of it has arrived
        self._filled = 0
        self._ready: collections.deque = collections.deque()  # whole messages, oldest first
        self._poller = select.poll()  # for spin()
        self._poller.register(self.fd, select.POLLIN)

    def send(self, data: bytes) -> None:
        header = _HEADER.pack(len(data))
        if len(data) < _LARGE:
            self._write(header + data)  # one write for the common small message
        else:
            self._write(header)  # no copy of a large one
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def message(self) -> bytes | bytearray | None:
        """The next whole message if it has arrived already, else None."""
        return self._ready.popleft() if self._ready else None

    def ready(self) -> bool:
        """True if a whole message has arrived (`message` would return it)."""
        return bool(self._ready)

    def pump(self) -> bool:
        """Reads whatever has arrived, without waiting; False once the other end is closed."""
        while True:
            try:
                if not self._receive(socket.MSG_DONTWAIT):
                    return False
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False

    def recv(self) -> bytes | bytearray:
        """The next whole message, waiting as long as it takes; EOFError once the other end is closed."""
        while not self._ready:
            if not self._receive(0):
                raise EOFError("the other end of the pipe is closed")
        return self._ready.popleft()

    def _receive(self, flags: int) -> bool:
        """One read from the socket; False at end of file (BlockingIOError with MSG_DONTWAIT and nothing there)."""
        if self._body is not None:
            count = self.sock.recv_into(memoryview(self._body)[self._filled :], 0, flags)
            if not count:
                return False
            self._filled += count
            if self._filled == len(self._body):
                self._ready.append(self._body)
                self._body = None
            return True
        chunk = self.sock.recv(1 << 16, flags)
        if not chunk:
            return False
        self._buffer += chunk
        self._split()
        return True

    def _split(self) -> None:
        """Moves the whole messages in the buffer to the ready ones; a large one under way gets its own buffer."""
        buffer, size = self._buffer, _HEADER.size
        while len(buffer) >= size:
            length = _HEADER.unpack_from(buffer)[0]
            if len(buffer) >= size + length:
                with memoryview(buffer) as view:
                    self._ready.append(bytes(view[size : size + length]))
                del buffer[: size + length]
            elif length >= _LARGE:
                self._body = bytearray(length)
                self._filled = len(buffer) - size
                self._body[: self._filled] = buffer[size:]
                buffer.clear()
            else:
                return

    def send_fd(self, data: bytes, fd: int) -> None:
        """One message with a file descriptor attached (SCM_RIGHTS): how a worker gets the shared block."""
        socket.send_fds(self.sock, [_HEADER.pack(len(data)) + data], [fd])

    def recv_fd(self) -> tuple[bytes | bytearray, int]:
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        if not fds:
            raise EOFError("expected a file descriptor from the other end of the pipe")
        self._buffer += data
        self._split()
        return self.recv(), fds[0]

    def spin(self, seconds: float) -> None:
        """Polls for a message for up to `seconds`, yielding the CPU in between, before the caller's blocking read:
        a message that arrives within the window is read without this process going to sleep and being woken."""
        if seconds > 0 and not self._ready:
            poll_without_sleeping(self._poller, seconds)

    def close(self) -> None:
        self.sock.close()


def poll_without_sleeping(poller: select.poll, seconds: float) -> list[tuple[int, int]]:
    """`poller`'s events, polled for up to `seconds` while yielding the CPU in between (never sleeping); [] if none
    came by then."""
    end = time.monotonic() + seconds
    while True:
        events = poller.poll(0)
        if events or time.monotonic() >= end:
            return events
        os.sched_yield()
