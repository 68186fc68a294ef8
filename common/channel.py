"""Length-prefixed messages over one end of a socketpair (what multiprocessing.Pipe builds on Unix).

Raw reads and writes with one read per message in the common case: about half the cost of
multiprocessing.Connection, which matters when a whole CartPole step costs a few microseconds. The worker reads with
blocking `recv`; the parent only reads what is there (`pump`), so no read can outlast a bound. A large message is read
into one buffer of its final size, so its cost grows with its size, not with its square.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

_HEADER = struct.Struct("!Q")
_CHUNK = 1 << 20


class Channel:
    """One end of a socketpair, carrying whole messages (bytes) both ways."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fd = sock.fileno()
        self._buffer = bytearray()  # bytes read past the last whole message
        self._poller = select.poll()  # for spin()
        self._poller.register(self.fd, select.POLLIN)

    def send(self, data: bytes) -> None:
        header = _HEADER.pack(len(data))
        if len(data) < _CHUNK:
            self._write(header + data)  # one write for the common small message
        else:
            self._write(header)  # no copy of a large one
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def message(self) -> bytes | None:
        """The next whole message if it has arrived already, else None."""
        buffer, size = self._buffer, _HEADER.size
        if len(buffer) >= size:
            end = size + _HEADER.unpack_from(buffer)[0]
            if len(buffer) >= end:
                with memoryview(buffer) as view:
                    msg = bytes(view[size:end])  # one copy
                del buffer[:end]
                return msg
        return None

    def _wanted(self) -> int:
        """How many bytes complete the message under way (at least a header's worth)."""
        buffer, size = self._buffer, _HEADER.size
        if len(buffer) < size:
            return size - len(buffer)
        return max(size + _HEADER.unpack_from(buffer)[0] - len(buffer), 1)

    def pump(self) -> bool:
        """Reads whatever has arrived, without waiting; False once the other end is closed."""
        while True:
            try:
                chunk = self.sock.recv(max(self._wanted(), _CHUNK), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self._buffer += chunk

    def recv(self) -> bytes:
        """The next whole message, waiting as long as it takes; EOFError once the other end is closed."""
        while (msg := self.message()) is None:
            chunk = os.read(self.fd, max(self._wanted(), 1 << 16))
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            self._buffer += chunk
        return msg

    def send_fd(self, data: bytes, fd: int) -> None:
        """One message with a file descriptor attached (SCM_RIGHTS): how a worker gets the shared block."""
        socket.send_fds(self.sock, [_HEADER.pack(len(data)) + data], [fd])

    def recv_fd(self) -> tuple[bytes, int]:
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        if not fds:
            raise EOFError("expected a file descriptor from the other end of the pipe")
        self._buffer += data
        return self.recv(), fds[0]

    def spin(self, seconds: float) -> None:
        """Polls for a message for up to `seconds`, yielding the CPU in between, before the caller's blocking read:
        a message that arrives within the window is read without this process going to sleep and being woken."""
        if seconds <= 0 or self._buffer:
            return
        end = time.perf_counter() + seconds
        while not self._poller.poll(0) and time.perf_counter() < end:
            os.sched_yield()

    def close(self) -> None:
        self.sock.close()
