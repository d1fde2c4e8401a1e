# pragma version 0.4.3
# pragma evm-version cancun
"""
@notice Test-only hostile account: a provider, submitter or challenger that
        calls back into the market whenever it is sent ETH, trying to be paid
        twice. `reenter` picks the call: 1 withdraw, 2 claim, 3 payout to
        itself, 4 reclaim; 0 accepts the ETH quietly.
"""

interface Market:
    def create_job(max_price: uint256) -> uint256: payable
    def stake(): payable
    def accept(job: uint256): nonpayable
    def claim(job: uint256): nonpayable
    def payout(job: uint256, providers: DynArray[address, 256]): nonpayable
    def reclaim(job: uint256): nonpayable
    def unbond(amount: uint256): nonpayable
    def release_stake(): nonpayable
    def open_dispute(job: uint256, provider: address) -> uint256: payable
    def withdraw(): nonpayable

market: public(address)
reenter: public(uint256)
job: public(uint256)


@deploy
def __init__(market: address):
    self.market = market


@external
def set_reentry(reenter: uint256, job: uint256):
    self.reenter = reenter
    self.job = job


@external
@payable
def create_job(max_price: uint256) -> uint256:
    return extcall Market(self.market).create_job(max_price, value=msg.value)


@external
@payable
def stake():
    extcall Market(self.market).stake(value=msg.value)


@external
def accept(job: uint256):
    extcall Market(self.market).accept(job)


@external
def claim(job: uint256):
    extcall Market(self.market).claim(job)


@external
def reclaim(job: uint256):
    extcall Market(self.market).reclaim(job)


@external
def unbond(amount: uint256):
    extcall Market(self.market).unbond(amount)


@external
def release_stake():
    extcall Market(self.market).release_stake()


@external
@payable
def open_dispute(job: uint256, provider: address) -> uint256:
    return extcall Market(self.market).open_dispute(job, provider, value=msg.value)


@external
def withdraw():
    extcall Market(self.market).withdraw()


@external
@payable
def __default__():
    if self.reenter == 1:
        extcall Market(self.market).withdraw()
    elif self.reenter == 2:
        extcall Market(self.market).claim(self.job)
    elif self.reenter == 3:
        extcall Market(self.market).payout(self.job, [self])
    elif self.reenter == 4:
        extcall Market(self.market).reclaim(self.job)
