# pragma version 0.4.3
# pragma evm-version cancun
"""
@notice Test-only hostile account: it calls back into the market whenever it
        is sent ETH, to show that the reentrancy lock and the payout stipend hold.
"""

interface Market:
    def create_job(max_price: uint256) -> uint256: payable
    def reclaim(job: uint256): nonpayable
    def withdraw(): nonpayable

market: public(address)


@deploy
def __init__(market: address):
    self.market = market


@external
@payable
def create_job() -> uint256:
    return extcall Market(self.market).create_job(1, value=msg.value)


@external
def reclaim(job: uint256):
    extcall Market(self.market).reclaim(job)


@external
def withdraw():
    extcall Market(self.market).withdraw()


@external
@payable
def __default__():
    # Re-enter with a call that would succeed on its own: only the
    # reentrancy lock can refuse it.
    extcall Market(self.market).create_job(1, value=msg.value)
