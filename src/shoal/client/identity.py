"""Signed requests: every call that changes the coordinator's state carries
the caller's Ethereum signature over what it asks, a nonce and a time.

The message is plain text signed as an EIP-191 personal message, so any
wallet can sign it; it names the coordinator it is meant for, so a request
signed for one coordinator cannot be replayed at another.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from shoal.errors import ControlError

ADDRESS = "x-shoal-address"
NONCE = "x-shoal-nonce"
TIMESTAMP = "x-shoal-timestamp"  # integer milliseconds since the epoch
SIGNATURE = "x-shoal-signature"
HEADERS = (ADDRESS, NONCE, TIMESTAMP, SIGNATURE)
# The hex SHA-256 of the body, which the signed message holds anyway: sent beside it, it
# lets the coordinator check who signed before it reads a body (a file of up to
# `max_file_bytes`), and refuse a stranger's without buffering it.
BODY_SHA256 = "x-shoal-body-sha256"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

_NONCE = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_SIGNATURE = re.compile(r"^0x[0-9a-fA-F]{130}$")


class Unauthenticated(ControlError):
    """The request's signature, nonce or time does not hold: it changes nothing (401)."""


@dataclass(frozen=True)
class Signer:
    """Who signed a request, once its signature has been checked."""

    address: str  # checksummed
    nonce: str
    timestamp_ms: int


def request_message(audience: str, method: str, target: str, body: bytes,
                    nonce: str, timestamp_ms: int) -> str:
    """The text a caller signs: the coordinator, the request line, the body's hash, nonce, time."""
    return _message(audience, method, target, hashlib.sha256(body).hexdigest(), nonce,
                    timestamp_ms)


def _message(audience: str, method: str, target: str, body_sha256: str, nonce: str,
             timestamp_ms: int) -> str:
    return "\n".join(("shoal-request-v1", audience, method.upper(), target, body_sha256,
                      nonce, str(timestamp_ms)))


def sign_request(account: LocalAccount, audience: str, method: str, target: str,
                 body: bytes, now_s: float | None = None) -> dict[str, str]:
    """Headers that make a request count as `account`'s (a fresh random nonce each time)."""
    nonce = secrets.token_urlsafe(18)
    timestamp_ms = int((time.time() if now_s is None else now_s) * 1000)
    digest = hashlib.sha256(body).hexdigest()
    message = _message(audience, method, target, digest, nonce, timestamp_ms)
    signed = account.sign_message(encode_defunct(text=message))
    return {ADDRESS: account.address, NONCE: nonce, TIMESTAMP: str(timestamp_ms),
            SIGNATURE: "0x" + bytes(signed.signature).hex(), BODY_SHA256: digest}


def verify_request(headers: dict[str, str], audience: str, method: str, target: str,
                   body: bytes, now_s: float, max_skew_s: float) -> Signer:
    """The signer of a request, or `Unauthenticated` saying what is wrong with it.

    The nonce is only checked for form here; that it was never used before
    is the store's to say (it remembers nonces for the skew window).
    """
    digest = hashlib.sha256(body).hexdigest()
    declared = headers.get(BODY_SHA256)
    if declared is not None and declared.lower() != digest:
        raise Unauthenticated(f"the body is not the one {BODY_SHA256} names: it was changed "
                              "on the way, or the header was computed on another body")
    return _verify(headers, audience, method, target, digest, now_s, max_skew_s)


def verify_signed_headers(headers: dict[str, str], audience: str, method: str, target: str,
                          now_s: float, max_skew_s: float) -> Signer:
    """The signer of a request whose body is not read yet, taking the body's hash from
    its `BODY_SHA256` header; `verify_request` on the body, once read, checks it is that
    one. Lets a large body be refused unread unless a known party signed it."""
    declared = headers.get(BODY_SHA256, "")
    if not _SHA256.match(declared.lower()):
        raise Unauthenticated(f"a body this large must be announced: send {BODY_SHA256}, the "
                              "hex SHA-256 of the body, with the signed headers")
    return _verify(headers, audience, method, target, declared.lower(), now_s, max_skew_s)


def _verify(headers: dict[str, str], audience: str, method: str, target: str,
            body_sha256: str, now_s: float, max_skew_s: float) -> Signer:
    missing = [name for name in HEADERS if not headers.get(name)]
    if missing:
        raise Unauthenticated(f"unsigned request: missing header(s) {', '.join(missing)}")
    claimed, nonce = headers[ADDRESS], headers[NONCE]
    if not _ADDRESS.match(claimed):
        raise Unauthenticated(f"{ADDRESS} must be a 0x-prefixed 20-byte hex address")
    if not _NONCE.match(nonce):
        raise Unauthenticated(f"{NONCE} must be 8 to 64 characters of [A-Za-z0-9_-]")
    try:
        timestamp_ms = int(headers[TIMESTAMP])
    except ValueError:
        raise Unauthenticated(f"{TIMESTAMP} must be integer milliseconds since the epoch") from None
    skew_s = abs(now_s - timestamp_ms / 1000)
    if skew_s > max_skew_s:
        raise Unauthenticated(
            f"request time is {skew_s:.0f} s from the coordinator's clock (at most "
            f"{max_skew_s:.0f} s allowed): check the caller's clock and sign again")
    signature = headers[SIGNATURE]
    if not _SIGNATURE.match(signature):
        raise Unauthenticated(f"{SIGNATURE} must be a 65-byte hex signature")
    message = _message(audience, method, target, body_sha256, nonce, timestamp_ms)
    try:
        signer = Account.recover_message(encode_defunct(text=message), signature=signature)
    except Exception:  # noqa: BLE001 - any malformed signature is the caller's fault alike
        raise Unauthenticated("the signature does not verify") from None
    if signer.lower() != claimed.lower():
        raise Unauthenticated(
            "the signature is not by the address in "
            f"{ADDRESS}: sign the exact method, path, body, nonce and time for this coordinator")
    return Signer(signer, nonce, timestamp_ms)


def load_key(path: str) -> LocalAccount:
    """A participant's key from a file holding a 0x-prefixed hex private key."""
    try:
        text = Path(path).read_text().strip()
    except OSError as error:
        raise ControlError(f"cannot read key file {path}: {error.strerror}; "
                           "create one with `shoal key new PATH`") from None
    try:
        return Account.from_key(text)
    except Exception:  # noqa: BLE001
        raise ControlError(f"key file {path} does not hold a hex private key") from None


def new_key(path: str) -> LocalAccount:
    """Create a key file readable only by its owner; refuse to overwrite one."""
    account = Account.create()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("0x" + bytes(account.key).hex() + "\n")
    return account
