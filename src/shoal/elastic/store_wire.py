"""The requests c10d's TCPStore clients send, read off the wire.

The gate (`shoal.elastic.gate`) relays a lease's bytes to the job's store only
request by request, each whole and each allowed by the store policy
(`shoal.elastic.store_policy`); to do that it must know where one request ends
and what it asks. The format is c10d's (TCPStoreBackend.hpp, torch 2.13): one
byte of query type, then the query's fields; a key or a value is a uint64
length and its bytes, a number is its native (little-endian) bytes.

Lengths are bounded before anything is allocated: a client that announces a
value of 2**63 bytes is refused on the eight bytes of its length.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from shoal.errors import ControlError

MAX_KEY_BYTES = 1024  # the runtime's keys are short (`arrive/12/agent-l7-a0-w0`)
MAX_VALUE_BYTES = 1 << 20  # its values too: an epoch's record of 1,000 members is ~60 kB
MAX_KEYS = 1024  # keys in one check, wait or multi-get
VALIDATION_MAGIC = 0x3C85F7CE  # the first request of a c10d client (TCPStoreBackend.hpp)
STOP_WAITING = b"\x00"  # the store's answer to a wait once its keys are set

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


class Query(enum.IntEnum):
    """c10d's QueryType, in its order."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


# What a query's fields are, after its type byte: k a key, v a value, n an int64,
# u a uint32, K a counted list of keys, P a counted list of (key, value) pairs.
_FIELDS: dict[Query, str] = {
    Query.VALIDATE: "u", Query.PING: "u",
    Query.SET: "kv", Query.COMPARE_SET: "kvv", Query.GET: "k", Query.ADD: "kn",
    Query.CHECK: "K", Query.WAIT: "K", Query.GETNUMKEYS: "", Query.DELETE_KEY: "k",
    Query.APPEND: "kv", Query.MULTI_GET: "K", Query.MULTI_SET: "P", Query.CANCEL_WAIT: "",
    Query.QUEUE_PUSH: "kv", Query.QUEUE_POP: "k", Query.QUEUE_LEN: "k",
}
# LIST_KEYS and BARRIER: newer queries the runtime never sends, and whose fields this
# reader does not know; a client that sends one is refused, not guessed at.

WRITES = frozenset({Query.SET, Query.COMPARE_SET, Query.ADD, Query.DELETE_KEY, Query.APPEND,
                    Query.MULTI_SET, Query.QUEUE_PUSH, Query.QUEUE_POP})


class WireError(ControlError):
    """Bytes that are not a c10d store request this gate relays (or one too large)."""


@dataclass(frozen=True)
class Request:
    query: Query
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()  # SET, APPEND: (value,); COMPARE_SET: (expected, new);
                                    # MULTI_SET: one per key
    number: int | None = None  # ADD's amount
    raw: bytes = b""  # the request as sent, to relay unchanged

    @property
    def writes(self) -> bool:
        if self.query is Query.COMPARE_SET and self.values[0] == self.values[1] != b"":
            # Expected and new value the same, not empty: nothing it can change (a missing
            # key stays missing). The runtime reads a key in one round trip so
            # (Rendezvous.read).
            return False
        return self.query in WRITES


class _Short(Exception):
    """The buffer ends inside the request: wait for more bytes."""


class RequestReader:
    """Cuts a client's byte stream into whole requests (`feed`), bounded as above."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._need = 1  # bytes the buffer must hold before a parse can succeed

    def feed(self, data: bytes) -> list[Request]:
        """The requests completed by `data`, in order (WireError: the stream is not one)."""
        self._buffer += data
        requests = []
        while len(self._buffer) >= self._need:
            try:
                request, used = _parse(self._buffer)
            except _Short as short:
                self._need = max(self._need, int(short.args[0]))
                break
            requests.append(request)
            del self._buffer[:used]
            self._need = 1
        return requests

    @property
    def pending(self) -> int:
        """Bytes held back: the start of a request not yet complete."""
        return len(self._buffer)


def _parse(buffer: bytearray) -> tuple[Request, int]:
    try:
        query = Query(buffer[0])
    except ValueError:
        raise WireError(f"unknown store query type {buffer[0]}") from None
    fields = _FIELDS.get(query)
    if fields is None:
        raise WireError(f"store query {query.name} is not relayed by the gate")
    at = 1
    keys: list[str] = []
    values: list[bytes] = []
    number: int | None = None
    for field in fields:
        if field == "u":
            _need(buffer, at + 4)
            at += 4
        elif field == "n":
            _need(buffer, at + 8)
            number = _I64.unpack_from(buffer, at)[0]
            at += 8
        elif field == "k":
            key, at = _bytes(buffer, at, MAX_KEY_BYTES, "key")
            keys.append(_text(key))
        elif field == "v":
            value, at = _bytes(buffer, at, MAX_VALUE_BYTES, "value")
            values.append(value)
        else:  # "K" or "P": a count, then keys (or key, value pairs)
            _need(buffer, at + 8)
            count = _U64.unpack_from(buffer, at)[0]
            at += 8
            if count > MAX_KEYS:
                raise WireError(f"{count} keys in one {query.name} (at most {MAX_KEYS})")
            for _ in range(count):
                key, at = _bytes(buffer, at, MAX_KEY_BYTES, "key")
                keys.append(_text(key))
                if field == "P":
                    value, at = _bytes(buffer, at, MAX_VALUE_BYTES, "value")
                    values.append(value)
    return Request(query, tuple(keys), tuple(values), number, bytes(buffer[:at])), at


def _need(buffer: bytearray, end: int) -> None:
    if len(buffer) < end:
        raise _Short(end)


def _bytes(buffer: bytearray, at: int, limit: int, what: str) -> tuple[bytes, int]:
    _need(buffer, at + 8)
    size = _U64.unpack_from(buffer, at)[0]
    if size > limit:
        raise WireError(f"a {what} of {size} bytes (at most {limit})")
    end = at + 8 + size
    _need(buffer, end)
    return bytes(buffer[at + 8:end]), end


def _text(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a key that is not UTF-8") from None


def encode(request: Request) -> bytes:
    """The wire bytes of `request` (tests, and an attacker's client, write these)."""
    out = bytearray([request.query])
    fields = _FIELDS[request.query]
    keys, values = list(request.keys), list(request.values)
    for field in fields:
        if field == "u":
            out += _U32.pack(request.number or 0)
        elif field == "n":
            out += _I64.pack(request.number or 0)
        elif field == "k":
            out += _sized(keys.pop(0).encode())
        elif field == "v":
            out += _sized(values.pop(0))
        else:
            count = len(keys)
            out += _U64.pack(count)
            for _ in range(count):
                out += _sized(keys.pop(0).encode())
                if field == "P":
                    out += _sized(values.pop(0))
    return bytes(out)


def value_answer(value: bytes) -> bytes:
    """The store's answer to a get or a compare-and-set: the value, sized."""
    return _sized(value)


def _sized(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data
