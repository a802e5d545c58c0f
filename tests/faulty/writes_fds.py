"""Faulty: sdpa writes a line into every file descriptor it inherited, the suite's
socket among them, then answers correctly; FloodsSocket writes 100 MB there."""

import os

from attention_conformance.backends.numpy import NumpyBackend


def _write_everywhere(data: bytes):
    for fd in range(64):
        try:
            os.write(fd, data)
        except OSError:
            pass


class WritesFds(NumpyBackend):
    name = "faulty-writes-fds"

    def sdpa(self, q, k, v, **kw):
        _write_everywhere(b"hello from the adapter\n")
        return super().sdpa(q, k, v, **kw)


class FloodsSocket(NumpyBackend):
    name = "faulty-floods-socket"

    def sdpa(self, q, k, v, **kw):
        block = b"x" * (1 << 20)
        for fd in range(3, 64):
            try:
                if os.fstat(fd).st_mode & 0o170000 == 0o140000:     # a socket
                    for _ in range(100):
                        os.write(fd, block)
            except OSError:
                pass
        return super().sdpa(q, k, v, **kw)
