"""Decoding the contract's events into typed `ChainEvent` records.

Events are the audit trail of every transfer and state change; decoding
them by topic here means receipts and log queries read the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from eth_abi import decode as abi_decode
from web3 import Web3

from shoal.spec.ledger import ChainEvent


def _plain(value: Any) -> int | str | bool:
    """An ABI value as JSON-able data: bytes become 0x-hex, addresses stay checksummed."""
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, str) and Web3.is_address(value):
        return Web3.to_checksum_address(value)
    if isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"unexpected event value {value!r}")


class EventDecoder:
    """Decodes logs of one contract ABI by their first topic."""

    def __init__(self, abi: Sequence[dict[str, Any]]) -> None:
        self._by_topic: dict[bytes, dict[str, Any]] = {}
        for item in abi:
            if item.get("type") != "event":
                continue
            types = ",".join(i["type"] for i in item["inputs"])
            topic = bytes(Web3.keccak(text=f"{item['name']}({types})"))
            self._by_topic[topic] = item

    def decode(self, log: Any) -> tuple[ChainEvent, ...]:
        """The records of `log`; none if it is not one of this ABI's events.

        A batch event (one log per `book` or `payout` call, its per-provider
        fields as equal-length arrays) becomes one record per provider, so
        readers see the same records whatever the batch size.
        """
        topics = [bytes(t) for t in log["topics"]]
        item = self._by_topic.get(topics[0]) if topics else None
        if item is None:
            return ()
        indexed = [i for i in item["inputs"] if i.get("indexed")]
        plain = [i for i in item["inputs"] if not i.get("indexed")]
        args: dict[str, Any] = {}
        for spec, topic in zip(indexed, topics[1:], strict=True):
            args[spec["name"]] = abi_decode([spec["type"]], topic)[0]
        values = abi_decode([i["type"] for i in plain], bytes(log["data"]))
        args.update({spec["name"]: value for spec, value in zip(plain, values, strict=True)})
        columns = {k: v for k, v in args.items() if isinstance(v, (list, tuple))}
        scalars = {k: v for k, v in args.items() if k not in columns}
        count = len(next(iter(columns.values()))) if columns else 1
        return tuple(
            ChainEvent(
                name=item["name"],
                block=int(log["blockNumber"]),
                tx_hash="0x" + bytes(log["transactionHash"]).hex(),
                log_index=int(log["logIndex"]),
                item=i,
                args={k: _plain(v) for k, v in (scalars | {k: c[i] for k, c in columns.items()}).items()},
            )
            for i in range(count)
        )

    def decode_all(self, logs: Iterable[Any]) -> tuple[ChainEvent, ...]:
        return tuple(e for log in logs for e in self.decode(log))
