"""benchmarks/udp_backlog.py reads the kernel's view of the UDP sockets: what is queued unread."""

from __future__ import annotations

import os
import socket

from benchmarks.udp_backlog import udp_queues


def test_the_sampler_sees_datagrams_nobody_read() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unread,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        unread.bind(("127.0.0.1", 0))
        for _ in range(20):
            sender.sendto(b"x" * 1000, unread.getsockname())
        queued, drops = udp_queues(os.getpid())
        assert queued >= 20 * 1000  # the kernel counts each datagram's buffer
        assert drops >= 0
        unread.setblocking(False)
        while True:
            try:
                unread.recv(2048)
            except BlockingIOError:
                break
        assert udp_queues(os.getpid())[0] < queued
