# pragma version 0.4.3
# pragma evm-version cancun
# pragma nonreentrancy on
"""
@title shoal compute market: escrow, stakes, work anchors and settlement
@notice Holds money and commitments only (hashes, counts, wei), never tensors.
        Every payment is a pull: amounts become credits that their owner
        withdraws, except `payout`, which pushes earnings with a 2300-gas
        stipend and falls back to a credit when the push fails. Every
        external function holds the (transient) reentrancy lock.
@dev    Revert reasons start with a category ("role:", "state:", "funds:",
        "time:", "input:") that the Python client maps to exception types.
"""

# ---------------------------------------------------------------- packing
# A lease is one storage word so that booking and paying a provider touch one
# slot: price per second (bits 0-127), verified seconds (128-191), flags.
PRICE_MASK: constant(uint256) = 2**128 - 1
SECONDS_MASK: constant(uint256) = 2**64 - 1
SECONDS_SHIFT: constant(uint256) = 128
LEASE_OPEN: constant(uint256) = 2**192
LEASE_DISPUTED: constant(uint256) = 2**193
LEASE_SLASHED: constant(uint256) = 2**194

BPS: constant(uint256) = 10_000
MAX_BATCH: constant(uint256) = 256

# A job is open from funding until settled; settled_at == 0 means open.
struct Job:
    submitter: address
    max_price: uint256  # wei per second, the ceiling for any lease
    escrow: uint256  # wei deposited by the submitter
    owed: uint256  # wei for booked verified work of unslashed leases
    last_active: uint256  # last operator action on the job (silence deadline)
    epochs: uint256  # number of anchored epochs; the next epoch index
    settled_at: uint256

# Dispute states
DISPUTE_OPEN: constant(uint256) = 1
DISPUTE_UPHELD: constant(uint256) = 2
DISPUTE_REJECTED: constant(uint256) = 3
DISPUTE_EXPIRED: constant(uint256) = 4

struct Dispute:
    job: uint256
    provider: address
    challenger: address
    bond: uint256
    opened_at: uint256
    state: uint256

# ---------------------------------------------------------------- events
event RoleChanged:
    role: String[8]
    account: indexed(address)

event JobFunded:
    job: indexed(uint256)
    submitter: indexed(address)
    amount: uint256
    max_price: uint256

event LeaseOpened:
    job: indexed(uint256)
    provider: indexed(address)
    price: uint256

event Anchored:
    job: indexed(uint256)
    epoch: uint256
    root: bytes32

event WorkBooked:
    job: indexed(uint256)
    provider: indexed(address)
    epoch: uint256
    seconds: uint256
    cost: uint256

event JobSettled:
    job: indexed(uint256)
    owed: uint256
    fee: uint256
    refund: uint256
    by_submitter: bool

event Paid:
    job: indexed(uint256)
    provider: indexed(address)
    amount: uint256
    pushed: bool

event Staked:
    provider: indexed(address)
    amount: uint256

event UnbondRequested:
    provider: indexed(address)
    amount: uint256
    release_at: uint256

event StakeReleased:
    provider: indexed(address)
    amount: uint256

event Slashed:
    job: indexed(uint256)
    provider: indexed(address)
    amount: uint256
    whistleblower: address
    reward: uint256
    forfeited: uint256

event DisputeOpened:
    dispute: indexed(uint256)
    job: indexed(uint256)
    provider: indexed(address)
    challenger: address
    bond: uint256

event DisputeClosed:
    dispute: indexed(uint256)
    state: uint256

event Withdrawn:
    account: indexed(address)
    amount: uint256

# ---------------------------------------------------------------- state
owner: public(address)
operator: public(address)
referee: public(address)

fee_bps: public(immutable(uint256))
whistleblower_bps: public(immutable(uint256))
min_stake: public(immutable(uint256))
min_bond: public(immutable(uint256))
unbonding_delay_s: public(immutable(uint256))
silence_timeout_s: public(immutable(uint256))
dispute_window_s: public(immutable(uint256))

jobs: public(HashMap[uint256, Job])
job_count: public(uint256)
leases: public(HashMap[uint256, HashMap[address, uint256]])
roots: public(HashMap[uint256, HashMap[uint256, bytes32]])

stakes: public(HashMap[address, uint256])
unbonding: public(HashMap[address, uint256])
release_at: public(HashMap[address, uint256])

disputes: public(HashMap[uint256, Dispute])
dispute_count: public(uint256)

credits: public(HashMap[address, uint256])


@deploy
def __init__(
    operator: address,
    referee: address,
    fee_bps_: uint256,
    whistleblower_bps_: uint256,
    min_stake_: uint256,
    min_bond_: uint256,
    unbonding_delay_s_: uint256,
    silence_timeout_s_: uint256,
    dispute_window_s_: uint256,
):
    assert operator != empty(address) and referee != empty(address), "input: operator and referee must be set"
    assert fee_bps_ <= BPS and whistleblower_bps_ <= BPS, "input: basis points must be at most 10000"
    self.owner = msg.sender
    self.operator = operator
    self.referee = referee
    fee_bps = fee_bps_
    whistleblower_bps = whistleblower_bps_
    min_stake = min_stake_
    min_bond = min_bond_
    unbonding_delay_s = unbonding_delay_s_
    silence_timeout_s = silence_timeout_s_
    dispute_window_s = dispute_window_s_


# ---------------------------------------------------------------- roles
@external
def set_operator(account: address):
    assert msg.sender == self.owner, "role: only the owner may change the operator"
    assert account != empty(address), "input: operator must be a nonzero address"
    self.operator = account
    log RoleChanged(role="operator", account=account)


@external
def set_referee(account: address):
    assert msg.sender == self.owner, "role: only the owner may change the referee"
    assert account != empty(address), "input: referee must be a nonzero address"
    self.referee = account
    log RoleChanged(role="referee", account=account)


# ---------------------------------------------------------------- jobs
# Job members are read one by one: copying the whole struct would cost a
# cold load for each of its seven slots.
@internal
@view
def _require_open(job: uint256):
    assert self.jobs[job].submitter != empty(address), "state: no such job"
    assert self.jobs[job].settled_at == 0, "state: job is already settled"


@external
@payable
def create_job(max_price: uint256) -> uint256:
    assert msg.value > 0, "funds: a job needs a nonzero escrow deposit"
    assert max_price > 0 and max_price <= PRICE_MASK, "input: max price must be 1 to 2**128-1 wei per second"
    job: uint256 = self.job_count + 1
    self.job_count = job
    self.jobs[job] = Job(
        submitter=msg.sender,
        max_price=max_price,
        escrow=msg.value,
        owed=0,
        last_active=block.timestamp,
        epochs=0,
        settled_at=0,
    )
    log JobFunded(job=job, submitter=msg.sender, amount=msg.value, max_price=max_price)
    return job


@external
@payable
def fund(job: uint256):
    self._require_open(job)
    assert msg.sender == self.jobs[job].submitter, "role: only the job's submitter may fund it"
    assert msg.value > 0, "funds: send a nonzero amount to fund a job"
    self.jobs[job].escrow += msg.value
    log JobFunded(job=job, submitter=msg.sender, amount=msg.value, max_price=self.jobs[job].max_price)


@external
def open_lease(job: uint256, provider: address, price: uint256):
    assert msg.sender == self.operator, "role: only the operator may open leases"
    self._require_open(job)
    assert provider != empty(address), "input: provider must be a nonzero address"
    assert price > 0 and price <= self.jobs[job].max_price, "input: lease price must be 1 wei/s up to the job's max price"
    assert self.leases[job][provider] == 0, "state: provider already has a lease on this job"
    assert self.stakes[provider] >= min_stake, "funds: provider's stake is below the minimum"
    self.leases[job][provider] = price | LEASE_OPEN
    self.jobs[job].last_active = block.timestamp
    log LeaseOpened(job=job, provider=provider, price=price)


@external
def anchor(job: uint256, epoch: uint256, root: bytes32):
    assert msg.sender == self.operator, "role: only the operator may anchor roots"
    self._require_open(job)
    assert epoch == self.jobs[job].epochs, "state: epochs must be anchored in order, once each"
    assert root != empty(bytes32), "input: a Merkle root cannot be zero"
    self.roots[job][epoch] = root
    self.jobs[job].epochs = epoch + 1
    self.jobs[job].last_active = block.timestamp
    log Anchored(job=job, epoch=epoch, root=root)


@external
def book(job: uint256, epoch: uint256, providers: DynArray[address, MAX_BATCH], seconds: DynArray[uint256, MAX_BATCH]):
    assert msg.sender == self.operator, "role: only the operator may book verified work"
    self._require_open(job)
    assert epoch < self.jobs[job].epochs, "state: book work only for an anchored epoch"
    assert len(providers) == len(seconds), "input: providers and seconds differ in length"
    added: uint256 = 0
    for i: uint256 in range(len(providers), bound=MAX_BATCH):
        provider: address = providers[i]
        lease: uint256 = self.leases[job][provider]
        assert lease & LEASE_OPEN != 0, "state: provider has no lease on this job"
        assert lease & LEASE_SLASHED == 0, "state: provider was slashed on this job"
        total: uint256 = ((lease >> SECONDS_SHIFT) & SECONDS_MASK) + seconds[i]
        assert total <= SECONDS_MASK, "input: verified seconds overflow the lease"
        cost: uint256 = (lease & PRICE_MASK) * seconds[i]
        self.leases[job][provider] = (lease & ~(SECONDS_MASK << SECONDS_SHIFT)) | (total << SECONDS_SHIFT)
        added += cost
        log WorkBooked(job=job, provider=provider, epoch=epoch, seconds=seconds[i], cost=cost)
    owed: uint256 = self.jobs[job].owed + added
    # The fee rides on top of the providers' pay, so escrow must cover both.
    assert owed + owed * fee_bps // BPS <= self.jobs[job].escrow, "funds: escrow cannot cover this work; the submitter must fund the job"
    self.jobs[job].owed = owed
    self.jobs[job].last_active = block.timestamp


@internal
def _close(job: uint256, fee: uint256, by_submitter: bool):
    owed: uint256 = self.jobs[job].owed
    refund: uint256 = self.jobs[job].escrow - owed - fee
    submitter: address = self.jobs[job].submitter
    self.jobs[job].settled_at = block.timestamp
    if fee > 0:
        self.credits[self.operator] += fee
    if refund > 0:
        self.credits[submitter] += refund
    log JobSettled(job=job, owed=owed, fee=fee, refund=refund, by_submitter=by_submitter)


@external
def settle(job: uint256):
    # O(1) in the number of providers: their pay stays in the contract as
    # `owed` and each lease is released by `payout` or `claim`.
    assert msg.sender == self.operator, "role: only the operator may settle a job"
    self._require_open(job)
    self._close(job, self.jobs[job].owed * fee_bps // BPS, False)


@external
def reclaim(job: uint256):
    self._require_open(job)
    assert msg.sender == self.jobs[job].submitter, "role: only the job's submitter may reclaim it"
    assert block.timestamp > self.jobs[job].last_active + silence_timeout_s, "time: the operator is not yet silent past the deadline"
    # A silent operator forfeits its fee; booked verified work is still paid.
    self._close(job, 0, True)


# ---------------------------------------------------------------- paying providers
@internal
def _release(job: uint256, provider: address) -> uint256:
    settled_at: uint256 = self.jobs[job].settled_at
    assert settled_at != 0, "state: job is not settled yet"
    assert block.timestamp >= settled_at + dispute_window_s, "time: earnings are paid after the job's dispute window"
    lease: uint256 = self.leases[job][provider]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was slashed on this job and is not paid for it"
    assert lease & LEASE_DISPUTED == 0, "state: a dispute on this lease is open"
    # Clearing the word refunds most of its write cost and marks it paid.
    self.leases[job][provider] = 0
    return (lease & PRICE_MASK) * ((lease >> SECONDS_SHIFT) & SECONDS_MASK)


@external
def payout(job: uint256, providers: DynArray[address, MAX_BATCH]):
    # Anyone may push providers their earnings; the 2300-gas stipend cannot
    # re-enter, and a recipient that refuses the push gets a credit instead.
    for provider: address in providers:
        amount: uint256 = self._release(job, provider)
        pushed: bool = False
        if amount > 0:
            pushed = raw_call(provider, b"", value=amount, gas=0, revert_on_failure=False)
            if not pushed:
                self.credits[provider] += amount
        log Paid(job=job, provider=provider, amount=amount, pushed=pushed)


@external
def claim(job: uint256):
    amount: uint256 = self._release(job, msg.sender)
    self.credits[msg.sender] += amount
    log Paid(job=job, provider=msg.sender, amount=amount, pushed=False)


@external
def withdraw():
    amount: uint256 = self.credits[msg.sender]
    assert amount > 0, "funds: nothing to withdraw; credits come from refunds, fees, rewards, released stake"
    self.credits[msg.sender] = 0
    log Withdrawn(account=msg.sender, amount=amount)
    raw_call(msg.sender, b"", value=amount)


# ---------------------------------------------------------------- stakes
@external
@payable
def stake():
    assert msg.value > 0, "funds: send a nonzero amount to stake"
    self.stakes[msg.sender] += msg.value
    log Staked(provider=msg.sender, amount=msg.value)


@external
def unbond(amount: uint256):
    assert amount > 0, "input: unbond a nonzero amount"
    assert amount <= self.stakes[msg.sender], "funds: cannot unbond more than the active stake"
    self.stakes[msg.sender] -= amount
    self.unbonding[msg.sender] += amount
    # Unbonding stake stays slashable; a new request restarts the delay.
    release: uint256 = block.timestamp + unbonding_delay_s
    self.release_at[msg.sender] = release
    log UnbondRequested(provider=msg.sender, amount=amount, release_at=release)


@external
def release_stake():
    amount: uint256 = self.unbonding[msg.sender]
    assert amount > 0, "state: no stake is unbonding"
    assert block.timestamp >= self.release_at[msg.sender], "time: stake is still unbonding"
    self.unbonding[msg.sender] = 0
    self.credits[msg.sender] += amount
    log StakeReleased(provider=msg.sender, amount=amount)


# ---------------------------------------------------------------- slashing and disputes
@internal
def _slash(job: uint256, provider: address, amount: uint256, whistleblower: address):
    lease: uint256 = self.leases[job][provider]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was already slashed on this job"
    active: uint256 = self.stakes[provider]
    pending: uint256 = self.unbonding[provider]
    taken: uint256 = min(amount, active + pending)
    from_active: uint256 = min(taken, active)
    self.stakes[provider] = active - from_active
    self.unbonding[provider] = pending - (taken - from_active)
    reward: uint256 = taken * whistleblower_bps // BPS
    if reward > 0:
        self.credits[whistleblower] += reward
    # The cheat forfeits its pay for this job: it goes back to the submitter,
    # through the escrow while the job is open, as a credit once settled.
    forfeited: uint256 = (lease & PRICE_MASK) * ((lease >> SECONDS_SHIFT) & SECONDS_MASK)
    to_submitter: uint256 = taken - reward
    if self.jobs[job].settled_at == 0:
        self.jobs[job].owed -= forfeited
    else:
        to_submitter += forfeited
    if to_submitter > 0:
        self.credits[self.jobs[job].submitter] += to_submitter
    self.leases[job][provider] = (lease | LEASE_SLASHED) & ~LEASE_DISPUTED
    log Slashed(job=job, provider=provider, amount=taken, whistleblower=whistleblower, reward=reward, forfeited=forfeited)


@external
def slash(job: uint256, provider: address, amount: uint256, whistleblower: address):
    assert msg.sender == self.referee, "role: only the referee may slash"
    assert whistleblower != empty(address), "input: whistleblower must be a nonzero address"
    assert self.leases[job][provider] & LEASE_DISPUTED == 0, "state: a dispute on this lease is open; resolve it instead"
    self._slash(job, provider, amount, whistleblower)


@external
@payable
def open_dispute(job: uint256, provider: address) -> uint256:
    assert msg.value > 0 and msg.value >= min_bond, "funds: a dispute needs a bond of at least min_bond"
    assert self.jobs[job].submitter != empty(address), "state: no such job"
    settled_at: uint256 = self.jobs[job].settled_at
    if settled_at != 0:
        assert block.timestamp < settled_at + dispute_window_s, "time: the job's dispute window has closed"
    lease: uint256 = self.leases[job][provider]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was already slashed on this job"
    assert lease & LEASE_DISPUTED == 0, "state: a dispute on this lease is already open"
    self.leases[job][provider] = lease | LEASE_DISPUTED
    dispute: uint256 = self.dispute_count + 1
    self.dispute_count = dispute
    self.disputes[dispute] = Dispute(
        job=job,
        provider=provider,
        challenger=msg.sender,
        bond=msg.value,
        opened_at=block.timestamp,
        state=DISPUTE_OPEN,
    )
    log DisputeOpened(dispute=dispute, job=job, provider=provider, challenger=msg.sender, bond=msg.value)
    return dispute


@internal
def _close_dispute(dispute: uint256, state: uint256) -> Dispute:
    d: Dispute = self.disputes[dispute]
    assert d.state == DISPUTE_OPEN, "state: no open dispute with this id"
    self.disputes[dispute].state = state
    self.leases[d.job][d.provider] &= ~LEASE_DISPUTED
    log DisputeClosed(dispute=dispute, state=state)
    return d


@external
def resolve_dispute(dispute: uint256, upheld: bool):
    assert msg.sender == self.referee, "role: only the referee may resolve disputes"
    if upheld:
        d: Dispute = self._close_dispute(dispute, DISPUTE_UPHELD)
        self.credits[d.challenger] += d.bond
        self._slash(d.job, d.provider, max_value(uint256), d.challenger)
    else:
        # A rejected accusation compensates the accused provider.
        d: Dispute = self._close_dispute(dispute, DISPUTE_REJECTED)
        self.credits[d.provider] += d.bond


@external
def expire_dispute(dispute: uint256):
    # A silent referee must not freeze a provider's pay forever.
    assert self.disputes[dispute].state == DISPUTE_OPEN, "state: no open dispute with this id"
    assert block.timestamp > self.disputes[dispute].opened_at + silence_timeout_s, "time: the referee may still resolve this dispute"
    d: Dispute = self._close_dispute(dispute, DISPUTE_EXPIRED)
    self.credits[d.challenger] += d.bond
