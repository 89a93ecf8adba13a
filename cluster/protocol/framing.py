"""Size-prefixed Kafka frames, sans-IO: bytes in, whole frames out (h11 style)."""

from __future__ import annotations

import struct

from cluster.protocol.errors import FrameTooLarge, ProtocolError

_SIZE = struct.Struct(">i")


class FrameDecoder:
    """Accumulates received bytes and yields whole request frames.

    The declared size is checked against `max_frame_bytes` before any buffer for the
    frame is allocated; the frame buffer is then filled in place (one copy per byte).
    """

    def __init__(self, max_frame_bytes: int, limit_name: str = "socket.request.max.bytes") -> None:
        self.max_frame_bytes = max_frame_bytes
        self.limit_name = limit_name  # the setting the limit comes from, for the error
        self._size_buf = bytearray()
        self._frame: bytearray | None = None
        self._filled = 0
        self._ready: list[bytearray] = []

    @property
    def wants_bytes(self) -> int:
        """How many bytes would complete the current size prefix or frame."""
        if self._frame is None:
            return 4 - len(self._size_buf)
        return len(self._frame) - self._filled

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            if self._frame is None:
                need = 4 - len(self._size_buf)
                self._size_buf += view[:need]
                view = view[need:]
                if len(self._size_buf) < 4:
                    return
                (size,) = _SIZE.unpack(self._size_buf)
                self._size_buf.clear()
                if size < 0:
                    raise ProtocolError(f"negative frame size {size}")
                if size > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"frame of {size} bytes exceeds {self.limit_name}={self.max_frame_bytes}"
                    )
                self._frame = bytearray(size)
                self._filled = 0
                if size == 0:
                    self._ready.append(self._frame)
                    self._frame = None
                continue
            n = min(len(view), len(self._frame) - self._filled)
            self._frame[self._filled : self._filled + n] = view[:n]
            self._filled += n
            view = view[n:]
            if self._filled == len(self._frame):
                self._ready.append(self._frame)
                self._frame = None

    def next_frame(self) -> bytearray | None:
        return self._ready.pop(0) if self._ready else None

    @property
    def frame_buffer(self) -> memoryview | None:
        """The unfilled part of the frame being read, for recv_into (avoids a copy)."""
        if self._frame is None:
            return None
        return memoryview(self._frame)[self._filled :]

    def filled(self, n: int) -> None:
        """Account for `n` bytes written into `frame_buffer` directly."""
        assert self._frame is not None
        self._filled += n
        if self._filled == len(self._frame):
            self._ready.append(self._frame)
            self._frame = None


def encode_frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body
