"""Chains for the ledger tests: the embedded py-evm chain and a real Hardhat node.

The Hardhat node is installed from tests/ledger/hardhat/package-lock.json
(`npm ci`) the first time it is needed and serves JSON-RPC on 127.0.0.1 at a
free port for the whole session; only a machine without node/npm skips it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from shoal.ledger import Chain, ContractRevert, Ledger
from shoal.spec.ledger import LedgerConfig, TxOutcome
from tests.harness.installs import one_installer

HARDHAT_DIR = Path(__file__).resolve().parent / "hardhat"
NODE_START_TIMEOUT_S = 90.0
NPM_CI_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Actors:
    """Dev accounts by role; `stranger` holds no role at all."""

    owner: LocalAccount
    operator: LocalAccount
    referee: LocalAccount
    submitters: tuple[LocalAccount, LocalAccount]
    providers: tuple[LocalAccount, LocalAccount, LocalAccount]
    whistleblower: LocalAccount
    stranger: LocalAccount

    @classmethod
    def of(cls, chain: Chain) -> Actors:
        a = chain.dev_accounts()
        return cls(a[0], a[1], a[2], (a[3], a[4]), (a[5], a[6], a[7]), a[8], a[9])

    def all(self) -> list[LocalAccount]:
        return [self.owner, self.operator, self.referee, *self.submitters,
                *self.providers, self.whistleblower, self.stranger]


class Wallets:
    """Each account's balance from a starting point, net of the gas it paid."""

    def __init__(self, chain: Chain, accounts: list[str]) -> None:
        self.chain = chain
        self.start = {a: chain.balance(a) for a in accounts}
        self.fees = dict.fromkeys(accounts, 0)

    def paid(self, account: str, outcome: TxOutcome | list[TxOutcome]) -> None:
        for o in outcome if isinstance(outcome, list) else [outcome]:
            self.fees[account] += o.fee_wei

    @contextlib.contextmanager
    def refused(self, account: str, error: type[ContractRevert], match: str) -> Iterator[None]:
        """Expect a revert of `error` whose reason matches; charge its gas to `account`."""
        with pytest.raises(error, match=match) as caught:
            yield
        self.fees[account] += caught.value.fee_wei

    def net(self, account: str) -> int:
        """Wei gained (or lost) by `account` other than gas."""
        return self.chain.balance(account) - self.start[account] + self.fees[account]


def deploy(chain: Chain, actors: Actors, **config: int) -> Ledger:
    return Ledger.deploy(
        chain, actors.owner, actors.operator.address, actors.referee.address, LedgerConfig(**config)
    )


@pytest.fixture(scope="session")
def embedded_chain() -> Chain:
    return Chain.embedded()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rpc_ready(url: str) -> bool:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2.0) as reply:
            return "result" in json.loads(reply.read())
    except OSError:
        return False


def hardhat_binary() -> Path:
    """Hardhat from tests/ledger/hardhat's lock file, installed on first use."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed; the JSON-RPC tests need Node 20 + npm")
    hardhat = HARDHAT_DIR / "node_modules" / ".bin" / "hardhat"
    with one_installer("hardhat"):  # looked at under the lock: an install may be half done
        if not hardhat.exists():
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"], cwd=HARDHAT_DIR, check=True,
                timeout=NPM_CI_TIMEOUT_S,
            )
    return hardhat


def wait_for_node(url: str, node: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    while not _rpc_ready(url):
        if node.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"hardhat node did not start; its log:\n{log_path.read_text()}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def hardhat_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    hardhat = hardhat_binary()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("hardhat") / "node.log"
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true"}
    with open(log_path, "w") as log:
        node = subprocess.Popen(
            [str(hardhat), "node", "--hostname", "127.0.0.1", "--port", str(port)],
            cwd=HARDHAT_DIR, stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    try:
        wait_for_node(url, node, log_path)
        yield url
    finally:
        node.terminate()
        try:
            node.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


@pytest.fixture(params=["embedded", pytest.param("hardhat", marks=pytest.mark.slow)])
def chain(request: pytest.FixtureRequest) -> Chain:
    """Each backend in turn: the in-process chain and a real JSON-RPC node."""
    if request.param == "embedded":
        return Chain.embedded()
    return Chain.rpc(request.getfixturevalue("hardhat_url"))
