"""A minimal TURN client that probes what a TURN server relays, and to where.

Raw STUN messages (RFC 8489) over UDP or TCP, so that every request and attribute is the
test's own: UDP allocations (RFC 8656) of either address family (REQUESTED-ADDRESS-FAMILY,
RFC 6156), permissions, Send indications, and TCP allocations with Connect and
ConnectionBind (RFC 6062), which aioice's TURN client does not speak. Long-term credentials
(a static pair or the TURN REST API's issued ones: the same mechanism). Every wait is bounded
by ``timeout``; blocking sockets only.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAGIC_COOKIE = 0x2112A442
HEADER = struct.Struct("!HHI12s")


class Method(enum.IntEnum):
    BINDING = 0x001
    ALLOCATE = 0x003
    REFRESH = 0x004
    SEND = 0x006
    DATA = 0x007
    CREATE_PERMISSION = 0x008
    CONNECT = 0x00A
    CONNECTION_BIND = 0x00B


class Class(enum.IntEnum):
    REQUEST = 0b00
    INDICATION = 0b01
    SUCCESS = 0b10
    ERROR = 0b11


class Attr(enum.IntEnum):
    USERNAME = 0x0006
    MESSAGE_INTEGRITY = 0x0008
    ERROR_CODE = 0x0009
    LIFETIME = 0x000D
    XOR_PEER_ADDRESS = 0x0012
    DATA = 0x0013
    REALM = 0x0014
    NONCE = 0x0015
    XOR_RELAYED_ADDRESS = 0x0016
    REQUESTED_ADDRESS_FAMILY = 0x0017
    REQUESTED_TRANSPORT = 0x0019
    CONNECTION_ID = 0x002A


UDP, TCP = 17, 6  # REQUESTED-TRANSPORT protocol numbers
# an attribute's value, or a function of the transaction id that makes it (XOR addresses)
Value = bytes | Callable[[bytes], bytes]


class TurnError(Exception):
    """The server answered with an error response (``code``, e.g. 403 Forbidden IP)."""

    def __init__(self, method: Method, code: int, reason: str) -> None:
        super().__init__(f"{method.name}: {code} {reason}")
        self.code = code
        self.reason = reason


@dataclass
class Message:
    method: int
    cls: Class
    transaction_id: bytes
    attributes: dict[int, bytes] = field(default_factory=dict)

    def error(self) -> tuple[int, str]:
        value = self.attributes[Attr.ERROR_CODE]
        return value[2] * 100 + value[3], value[4:].decode(errors="replace")


def _pad(value: bytes) -> bytes:
    return value + b"\x00" * (-len(value) % 4)


def encode(
    method: int,
    cls: Class,
    transaction_id: bytes,
    attributes: Sequence[tuple[int, bytes]],
    key: bytes | None = None,
) -> bytes:
    """A STUN message; with ``key``, MESSAGE-INTEGRITY (HMAC-SHA1) last."""
    kind = (
        (method & 0x000F)
        | ((method & 0x0070) << 1)
        | ((method & 0x0F80) << 2)
        | ((cls & 0b01) << 4)
        | ((cls & 0b10) << 7)
    )
    body = b"".join(struct.pack("!HH", t, len(v)) + _pad(v) for t, v in attributes)
    if key is None:
        return HEADER.pack(kind, len(body), MAGIC_COOKIE, transaction_id) + body
    length = len(body) + 24  # the integrity attribute counts in the length it covers
    head = HEADER.pack(kind, length, MAGIC_COOKIE, transaction_id)
    digest = hmac.new(key, head + body, hashlib.sha1).digest()
    return head + body + struct.pack("!HH", Attr.MESSAGE_INTEGRITY, 20) + digest


def decode(data: bytes) -> Message:
    kind, length, cookie, transaction_id = HEADER.unpack_from(data)
    if cookie != MAGIC_COOKIE or len(data) < HEADER.size + length:
        raise ValueError("not a STUN message")
    method = (kind & 0x000F) | ((kind & 0x00E0) >> 1) | ((kind & 0x3E00) >> 2)
    cls = Class(((kind >> 4) & 0b01) | ((kind >> 7) & 0b10))
    attributes: dict[int, bytes] = {}
    offset = HEADER.size
    while offset + 4 <= HEADER.size + length:
        attr_type, attr_length = struct.unpack_from("!HH", data, offset)
        attributes.setdefault(attr_type, data[offset + 4 : offset + 4 + attr_length])
        offset += 4 + attr_length + (-attr_length % 4)
    return Message(method, cls, transaction_id, attributes)


def xor_address(host: str, port: int, transaction_id: bytes) -> bytes:
    """An XOR-PEER-ADDRESS value (IPv4 or IPv6)."""
    ip = ipaddress.ip_address(host)
    mask = struct.pack("!I", MAGIC_COOKIE) + transaction_id
    packed = bytes(a ^ b for a, b in zip(ip.packed, mask, strict=False))
    family = 0x01 if ip.version == 4 else 0x02
    return struct.pack("!BBH", 0, family, port ^ (MAGIC_COOKIE >> 16)) + packed


def unxor_address(value: bytes, transaction_id: bytes) -> tuple[str, int]:
    family, xport = struct.unpack_from("!xBH", value)
    mask = struct.pack("!I", MAGIC_COOKIE) + transaction_id
    size = 4 if family == 0x01 else 16
    packed = bytes(a ^ b for a, b in zip(value[4 : 4 + size], mask, strict=False))
    return str(ipaddress.ip_address(packed)), xport ^ (MAGIC_COOKIE >> 16)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the TURN server closed the connection")
        data += chunk
    return data


def read_tcp_message(sock: socket.socket) -> Message:
    """One STUN message from a TCP stream (header, then its length)."""
    head = _recv_exact(sock, HEADER.size)
    length = struct.unpack_from("!H", head, 2)[0]
    return decode(head + _recv_exact(sock, length))


def stun_binding_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a Binding request to ``host:port`` over UDP gets a success response."""
    transaction_id = os.urandom(12)
    with socket.socket(_family(host), socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(encode(Method.BINDING, Class.REQUEST, transaction_id, []), (host, port))
            answer = decode(sock.recv(2048))
        except (OSError, ValueError):
            return False
    return answer.cls == Class.SUCCESS and answer.transaction_id == transaction_id


class TurnClient:
    """One allocation on the TURN server at ``server`` (host, port) over ``transport`` (``UDP``
    or ``TCP`` both for the control connection and the relay), of ``family`` (4 or 6)."""

    def __init__(
        self,
        server: tuple[str, int],
        username: str,
        password: str,
        transport: int = UDP,
        family: int = 4,
        timeout: float = 3.0,
    ) -> None:
        self.server = server
        self.username = username
        self.password = password
        self.transport = transport
        self.family = family
        self.timeout = timeout
        self.realm = b""
        self.nonce = b""
        kind = socket.SOCK_DGRAM if transport == UDP else socket.SOCK_STREAM
        self.sock = socket.socket(_family(server[0]), kind)
        self.sock.settimeout(timeout)
        if transport == TCP:
            self.sock.connect(server)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> TurnClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _key(self) -> bytes:
        text = f"{self.username}:{self.realm.decode()}:{self.password}"
        return hashlib.md5(text.encode()).digest()  # the long-term key (RFC 8489 9.2.2)

    def _exchange(self, sock: socket.socket, message: bytes, transaction_id: bytes) -> Message:
        if self.transport == TCP:
            sock.sendall(message)
            while True:
                answer = read_tcp_message(sock)
                if answer.transaction_id == transaction_id:
                    return answer
        for _ in range(2):  # UDP: one retransmission, each wait bounded by the socket timeout
            sock.sendto(message, self.server)
            try:
                while True:
                    answer = decode(sock.recv(65536))
                    if answer.transaction_id == transaction_id:
                        return answer
            except TimeoutError:
                continue
        raise TimeoutError(f"no answer from the TURN server at {self.server}")

    def request(
        self,
        method: Method,
        attributes: list[tuple[int, Value]],
        sock: socket.socket | None = None,
    ) -> Message:
        """An authenticated request (the first one learns the realm and nonce from its 401, a
        stale nonce is retried); the success response, else TurnError."""
        sock = sock or self.sock
        for _ in range(3):
            transaction_id = os.urandom(12)
            attrs = [(t, v if isinstance(v, bytes) else v(transaction_id)) for t, v in attributes]
            key = None
            if self.nonce:
                attrs += [
                    (Attr.USERNAME, self.username.encode()),
                    (Attr.REALM, self.realm),
                    (Attr.NONCE, self.nonce),
                ]
                key = self._key()
            message = encode(method, Class.REQUEST, transaction_id, attrs, key)
            answer = self._exchange(sock, message, transaction_id)
            if answer.cls == Class.SUCCESS:
                return answer
            code, reason = answer.error()
            if code in (401, 438) and Attr.NONCE in answer.attributes:
                first = not self.nonce
                self.realm = answer.attributes.get(Attr.REALM, self.realm)
                self.nonce = answer.attributes[Attr.NONCE]
                if code == 438 or first:
                    continue
            raise TurnError(method, code, reason)
        raise TurnError(method, 401, "credentials refused")

    def allocate(self) -> tuple[str, int]:
        """The allocation; its relayed address."""
        attrs: list[tuple[int, Value]] = [
            (Attr.REQUESTED_TRANSPORT, bytes([self.transport, 0, 0, 0])),
            (Attr.LIFETIME, struct.pack("!I", 600)),
        ]
        if self.family == 6:
            attrs.append((Attr.REQUESTED_ADDRESS_FAMILY, bytes([0x02, 0, 0, 0])))
        answer = self.request(Method.ALLOCATE, attrs)
        relayed = answer.attributes[Attr.XOR_RELAYED_ADDRESS]
        return unxor_address(relayed, answer.transaction_id)

    def create_permission(self, peer: str) -> None:
        """A permission for ``peer`` (an IP address); TurnError if refused (403 Forbidden)."""
        self.request(
            Method.CREATE_PERMISSION,
            [(Attr.XOR_PEER_ADDRESS, lambda tid: xor_address(peer, 0, tid))],
        )

    def send(self, peer: tuple[str, int], data: bytes) -> None:
        """A Send indication: the server relays ``data`` to ``peer`` if a permission allows."""
        transaction_id = os.urandom(12)
        attrs = [(Attr.XOR_PEER_ADDRESS, xor_address(*peer, transaction_id)), (Attr.DATA, data)]
        self.sock.sendto(encode(Method.SEND, Class.INDICATION, transaction_id, attrs), self.server)

    def receive_data(self) -> tuple[tuple[str, int], bytes]:
        """The next Data indication (UDP): the peer it came from and its data."""
        while True:
            message = decode(self.sock.recv(65536))  # TimeoutError after ``timeout``
            if message.method == Method.DATA and message.cls == Class.INDICATION:
                peer = unxor_address(
                    message.attributes[Attr.XOR_PEER_ADDRESS], message.transaction_id
                )
                return peer, message.attributes[Attr.DATA]

    def connect(self, peer: tuple[str, int]) -> bytes:
        """RFC 6062 Connect (a TCP allocation): the server opens a TCP connection to ``peer``;
        its CONNECTION-ID."""
        answer = self.request(
            Method.CONNECT,
            [(Attr.XOR_PEER_ADDRESS, lambda tid: xor_address(*peer, tid))],
        )
        return answer.attributes[Attr.CONNECTION_ID]

    def bind_data_connection(self, connection_id: bytes) -> socket.socket:
        """RFC 6062 ConnectionBind on a new TCP connection: afterwards it carries the peer's
        bytes both ways."""
        data = socket.create_connection(self.server, timeout=self.timeout)
        try:
            self.request(Method.CONNECTION_BIND, [(Attr.CONNECTION_ID, connection_id)], data)
        except BaseException:
            data.close()
            raise
        return data
