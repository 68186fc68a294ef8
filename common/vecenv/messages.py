"""Length-prefixed messages over a socketpair, half the cost of multiprocessing.Connection's. The
parent takes only what has arrived (`pump`), so no read outlasts a bound."""

import collections
import os
import select
import socket
import struct
import time

_HEADER = struct.Struct("!Q")


class Channel:
    """One end of a socketpair, carrying whole messages (bytes) both ways."""

    def __init__(self, sock: socket.socket):
        self.sock, self.fd = sock, sock.fileno()
        self._buffer = bytearray()  # bytes read that are not yet a whole message
        self._ready: collections.deque = collections.deque()  # whole messages, oldest first
        self._body: bytearray | None = None  # a large message under way, `_filled` bytes of it read
        self._filled = 0
        self._poller = select.poll()
        self._poller.register(self.fd, select.POLLIN)

    def send(self, data: bytes) -> None:
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def message(self) -> bytes | None:
        """The next whole message if it has arrived already, else None."""
        return self._ready.popleft() if self._ready else None

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

    def recv(self) -> bytes:
        """The next whole message, however long it takes; EOFError once the other end closes."""
        while not self._ready:
            if not self._receive(0):
                raise EOFError("the other end of the pipe is closed")
        return self._ready.popleft()

    def _receive(self, flags: int) -> bool:
        """One read from the socket; False at end of file. A large message gets its own buffer."""
        if self._body is not None:
            count = self.sock.recv_into(memoryview(self._body)[self._filled :], 0, flags)
            self._filled += count
            if self._filled == len(self._body):
                self._ready.append(self._body)
                self._body = None
            return count > 0
        chunk = self.sock.recv(1 << 16, flags)
        self._take(chunk)
        return bool(chunk)

    def _take(self, chunk: bytes) -> None:
        buffer, size = self._buffer, _HEADER.size
        buffer += chunk
        while len(buffer) >= size:
            length = _HEADER.unpack_from(buffer)[0]
            if len(buffer) >= size + length:
                self._ready.append(bytes(buffer[size : size + length]))
                del buffer[: size + length]
            elif length >= 1 << 20:
                self._body, self._filled = bytearray(length), len(buffer) - size
                self._body[: self._filled] = buffer[size:]
                buffer.clear()
                return
            else:
                return

    def send_fd(self, data: bytes, fd: int) -> None:
        """One message with a file descriptor attached: how a worker gets the shared block."""
        socket.send_fds(self.sock, [_HEADER.pack(len(data)) + data], [fd])

    def recv_fd(self) -> tuple[bytes, int]:
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        self._take(data)
        return self.recv(), fds[0]

    def spin(self, seconds: float) -> None:
        """Polls up to `seconds` before a blocking read, so that a message then finds us awake."""
        if seconds > 0 and not self._ready:
            poll_without_sleeping(self._poller, seconds)

    def close(self) -> None:
        self.sock.close()


def poll_without_sleeping(poller: select.poll, seconds: float) -> list[tuple[int, int]]:
    """`poller`'s events, polled up to `seconds` while yielding the CPU; [] if none came."""
    end = time.monotonic() + seconds
    while True:
        events = poller.poll(0)
        if events or time.monotonic() >= end:
            return events
        os.sched_yield()
