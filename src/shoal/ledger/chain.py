"""A connection to an EVM chain: in-process (eth-tester + py-evm) or JSON-RPC.

The embedded chain is the default for one-machine runs and tests; a URL is
the real case. Dev-chain helpers (funded accounts, time travel, snapshots)
work on the embedded chain and on Hardhat/Anvil-style dev nodes only.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import Web3Exception

from shoal.ledger.errors import ChainUnavailable, LedgerError

log = logging.getLogger(__name__)

# The well-known mnemonic of Hardhat's and Anvil's prefunded dev accounts.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_CHAIN_IDS = frozenset({31337})


class ChainKind(str, enum.Enum):
    embedded = "embedded"
    rpc = "rpc"


class Chain:
    """A web3 connection plus what shoal needs to know about the node behind it."""

    def __init__(self, w3: Web3, kind: ChainKind, tester: Any = None, url: str = "") -> None:
        self.w3 = w3
        self.kind = kind
        self.url = url
        self._tester = tester  # eth_tester.EthereumTester for the embedded chain
        self.chain_id = int(w3.eth.chain_id)
        # Sender of read-only calls. Naming one spares eth-tester a lookup of
        # its accounts per call; py-evm checks it could pay for the gas, so on
        # the embedded chain it is a funded account.
        self.call_from = "0x" + "00" * 20
        if tester is not None:
            self.call_from = tester.get_accounts()[0]

    @classmethod
    def embedded(cls) -> Chain:
        """A fresh in-process chain (Prague rules) with ten prefunded accounts."""
        from eth_tester import EthereumTester, PyEVMBackend
        from web3 import EthereumTesterProvider

        tester = EthereumTester(PyEVMBackend())
        return cls(Web3(EthereumTesterProvider(tester)), ChainKind.embedded, tester=tester)

    @classmethod
    def rpc(cls, url: str, timeout_s: float = 10.0) -> Chain:
        """A JSON-RPC node at `url` (http:// or https://)."""
        if not url.startswith(("http://", "https://")):
            raise LedgerError(f"unsupported chain URL {url!r}: give an http:// or https:// JSON-RPC URL")
        w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": timeout_s}))
        try:
            return cls(w3, ChainKind.rpc, url=url)
        except (OSError, Web3Exception) as error:
            raise ChainUnavailable(
                f"no JSON-RPC node answers at {url} ({error.__class__.__name__}); "
                "start the node or fix --rpc"
            ) from error

    @classmethod
    def connect(cls, url: str | None, timeout_s: float = 10.0) -> Chain:
        return cls.embedded() if not url or url == "embedded" else cls.rpc(url, timeout_s)

    # ------------------------------------------------------------ reads
    def balance(self, address: str) -> int:
        return int(self.w3.eth.get_balance(Web3.to_checksum_address(address)))

    def now(self) -> int:
        """Chain time: the latest block's timestamp, in whole seconds."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    # ------------------------------------------------------------ dev chains
    def _require_dev(self, what: str) -> None:
        if self.kind is ChainKind.rpc and self.chain_id not in DEV_CHAIN_IDS:
            raise LedgerError(
                f"{what} needs a dev chain (embedded, or a dev node with chain id 31337); "
                f"this node has chain id {self.chain_id}"
            )

    def dev_accounts(self) -> list[LocalAccount]:
        """The prefunded accounts of a dev chain, with their private keys."""
        self._require_dev("dev accounts")
        if self._tester is not None:
            keys = self._tester.backend.account_keys
            return [Account.from_key(key.to_bytes()) for key in keys]
        Account.enable_unaudited_hdwallet_features()
        return [
            Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}")
            for i in range(10)
        ]

    def advance_time(self, seconds: int) -> int:
        """Move chain time forward by `seconds` and mine a block; returns the new time."""
        self._require_dev("time travel")
        if self._tester is not None:
            # From the pending block's time, not the latest's: the pending one follows the
            # wall clock, and after a quiet spell longer than `seconds` the latest block's
            # time plus `seconds` would lie behind it (eth-tester refuses to go back).
            pending = int(self._tester.get_block_by_number("pending")["timestamp"])
            target = max(self.now(), pending) + seconds
            self._tester.time_travel(target)
            return target
        self.w3.provider.make_request("evm_increaseTime", [seconds])
        self.w3.provider.make_request("evm_mine", [])
        return self.now()

    def snapshot(self) -> Any:
        """An id to `revert` the whole chain state to."""
        self._require_dev("snapshots")
        if self._tester is not None:
            return self._tester.take_snapshot()
        return self.w3.provider.make_request("evm_snapshot", [])["result"]

    def revert(self, snapshot: Any) -> None:
        self._require_dev("snapshots")
        if self._tester is not None:
            self._tester.revert_to_snapshot(snapshot)
            return
        if not self.w3.provider.make_request("evm_revert", [snapshot]).get("result"):
            raise LedgerError(f"the node refused to revert to snapshot {snapshot}")
