# pragma version 0.4.3
# pragma evm-version cancun
# pragma nonreentrancy on
"""
@title shoal compute market: escrow, stakes, work anchors and settlement
@notice Holds money and commitments only (hashes, counts, wei), never tensors.
        Every payment is a pull: amounts (earnings too) become credits that
        their owner withdraws, so `withdraw` is the only call that sends ETH,
        and a receiver that refuses ETH blocks nobody but itself. Every
        external function holds the (transient) reentrancy lock.
@dev    The rules that keep parties honest (README, "Settlement"):
        - a provider accepts a lease before it can be billed, by calling
          `accept` or by signing the lease's terms (EIP-712) for the
          operator's `open_accepted_leases`; accepting locks stake equal to the most the lease can earn (price x term,
          at least min_stake); unbonding never reaches locked stake, and the
          lock is released only when the lease is paid after its job's
          dispute window, or taken by a slash;
        - work is booked at most once per (job, epoch, provider), never for
          more seconds than have passed since the provider accepted;
        - a referee slash always goes through and closes the lease's open
          disputes; a lease's disputes are decided in the order they were
          opened, so the first to bring the evidence gets the reward, which
          is at most REWARD_BONDS bonds, as that first may be the cheat's
          sock; a rejected bond goes to the owner (treasury), never to the
          accused; the last dispute slot of a lease is the referee's;
        - pay and the operator's fee on it are released per lease after the
          window, and never while a dispute on the lease is open; a slashed
          lease pays neither.
        Revert reasons start with a category ("role:", "state:", "funds:",
        "time:", "input:") that the Python client maps to exception types.
"""

# ---------------------------------------------------------------- packing
# A lease is one storage word so that accepting, booking and paying a
# provider each touch one slot: price per second (bits 0-95), booked seconds
# (96-135), term in seconds (136-175), accepted-at time (176-215), the next
# epoch it may be booked for (216-247), flags (248-250).
PRICE_MASK: constant(uint256) = 2**96 - 1
SECONDS_MASK: constant(uint256) = 2**40 - 1
BOOKED_SHIFT: constant(uint256) = 96
TERM_SHIFT: constant(uint256) = 136
ACCEPTED_SHIFT: constant(uint256) = 176
EPOCH_SHIFT: constant(uint256) = 216
EPOCH_MASK: constant(uint256) = 2**32 - 1
BOOK_KEEP: constant(uint256) = ~((SECONDS_MASK << BOOKED_SHIFT) | (EPOCH_MASK << EPOCH_SHIFT))
LEASE_OPEN: constant(uint256) = 2**248
LEASE_DISPUTED: constant(uint256) = 2**249
LEASE_SLASHED: constant(uint256) = 2**250

# An account is one word too, so that paying a provider (unlocking its
# collateral and crediting its earnings) is one write: active stake (bits
# 0-84), of which locked (85-169), and credit, the wei it may withdraw
# (170-255). No field can exceed what the contract holds, which deposits keep
# at most MAX_HELD, so none can overflow into the next.
STAKE_MASK: constant(uint256) = 2**85 - 1
LOCKED_SHIFT: constant(uint256) = 85
CREDIT_SHIFT: constant(uint256) = 170
MAX_HELD: constant(uint256) = 2**85 - 1  # wei, about 38.7 million ETH

# EIP-712: a provider accepts a lease by signing its job, price, term and a
# deadline, bound to this contract on this chain. A (job, provider) lease is
# opened at most once (its word stays set until the job is settled, and a
# settled job opens no leases), so one signature opens at most one lease.
DOMAIN_TYPEHASH: constant(bytes32) = keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
DOMAIN_NAME_HASH: constant(bytes32) = keccak256("shoal compute market")
DOMAIN_VERSION_HASH: constant(bytes32) = keccak256("1")
ACCEPTANCE_TYPEHASH: constant(bytes32) = keccak256("LeaseAcceptance(uint256 job,address provider,uint256 price,uint256 termS,uint256 deadline)")
# secp256k1's order / 2: a signature with a higher s is the mirror image of a
# valid one (the same signer); only the low one is accepted (as in EIP-2).
HALF_CURVE_ORDER: constant(uint256) = 57896044618658097711785492504343953926418782139537452191302581570759080747168  # 0x7fff...ffff5d576e7357a4501ddfe92f46681b20a0

BPS: constant(uint256) = 10_000
MAX_BATCH: constant(uint256) = 256
# Per lease; each costs its opener a bond. The last is the referee's own
# (`open_dispute`), so accounts a cheat controls cannot fill them all.
MAX_OPEN_DISPUTES: constant(uint256) = 8
# A whistleblower's reward: its share of the slash, at most this many minimum
# bonds (see `_reward`).
REWARD_BONDS: constant(uint256) = 2

# A job is open from funding until settled; settled_at == 0 means open.
struct Job:
    submitter: address
    max_price: uint256  # wei per second, the ceiling for any lease
    escrow: uint256  # wei deposited by the submitter
    owed: uint256  # wei for booked work of unslashed leases
    fee: uint256  # operator fee reserved on `owed`, paid per lease when paid
    fee_bps: uint256  # the market's fee, or 0 once a silent operator forfeits it
    last_active: uint256  # last operator action on the job (silence deadline)
    epochs: uint256  # number of anchored epochs; the next epoch index
    settled_at: uint256

# A provider's signed agreement to a lease's terms (see ACCEPTANCE_TYPEHASH).
struct Acceptance:
    provider: address
    price: uint256  # wei per second
    term_s: uint256
    deadline: uint256  # chain time after which the signature opens nothing
    v: uint8
    r: bytes32
    s: bytes32

# Dispute states
DISPUTE_OPEN: constant(uint256) = 1
DISPUTE_UPHELD: constant(uint256) = 2
DISPUTE_REJECTED: constant(uint256) = 3
DISPUTE_EXPIRED: constant(uint256) = 4
DISPUTE_SUPERSEDED: constant(uint256) = 5  # the lease was slashed on other evidence

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

# Events of batch calls (opening, booking, paying) are one log per call,
# with a column per field: entry i is provider[i]'s. The Python client
# (shoal.ledger.events) reads each as one record per provider.
event LeaseOpened:
    job: indexed(uint256)
    provider: DynArray[address, MAX_BATCH]
    price: DynArray[uint256, MAX_BATCH]
    term_s: DynArray[uint256, MAX_BATCH]
    locked: DynArray[uint256, MAX_BATCH]  # collateral locked if it opened accepted; 0 if only offered

event LeaseAccepted:
    job: indexed(uint256)
    provider: indexed(address)
    locked: uint256

event Anchored:
    job: indexed(uint256)
    epoch: uint256
    root: bytes32

# One per `book` call: provider[i] worked seconds[i] in the epoch (cost: its
# lease's price x seconds). The client reads it as one record per provider.
event WorkBooked:
    job: indexed(uint256)
    epoch: uint256
    provider: DynArray[address, MAX_BATCH]
    seconds: DynArray[uint256, MAX_BATCH]

event JobSettled:
    job: indexed(uint256)
    owed: uint256
    fee: uint256
    refund: uint256
    by_submitter: bool

# provider[i]'s earnings, amount[i], were credited to it (it withdraws
# them). The operator's fee on each amount is amount x fee_bps / 10000
# (fee_bps of the job: 0 once reclaimed), credited to the operator.
event Paid:
    job: indexed(uint256)
    provider: DynArray[address, MAX_BATCH]
    amount: DynArray[uint256, MAX_BATCH]

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

event VerifierSlashed:
    verifier: indexed(address)
    amount: uint256
    whistleblower: indexed(address)
    reward: uint256


event DisputeOpened:
    dispute: indexed(uint256)
    job: indexed(uint256)
    provider: indexed(address)
    challenger: address
    bond: uint256

event DisputeClosed:
    dispute: indexed(uint256)
    state: uint256
    bond_to: address

event Withdrawn:
    account: indexed(address)
    amount: uint256

# ---------------------------------------------------------------- state
owner: public(address)  # also the treasury that rejected bonds go to
operator: public(address)
referee: public(address)

fee_bps: public(immutable(uint256))
whistleblower_bps: public(immutable(uint256))
min_stake: public(immutable(uint256))
min_bond: public(immutable(uint256))
unbonding_delay_s: public(immutable(uint256))
silence_timeout_s: public(immutable(uint256))
dispute_window_s: public(immutable(uint256))
dispute_timeout_s: public(immutable(uint256))

jobs: public(HashMap[uint256, Job])
job_count: public(uint256)
leases: public(HashMap[uint256, HashMap[address, uint256]])
roots: public(HashMap[uint256, HashMap[uint256, bytes32]])

accounts: public(HashMap[address, uint256])  # stake, locked and credit (see CREDIT_SHIFT)
unbonding: public(HashMap[address, uint256])
release_at: public(HashMap[address, uint256])

disputes: public(HashMap[uint256, Dispute])
dispute_count: public(uint256)
# Open disputes of each lease, oldest first.
lease_disputes: HashMap[uint256, HashMap[address, DynArray[uint256, MAX_OPEN_DISPUTES]]]


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
    dispute_timeout_s_: uint256,
):
    assert operator != empty(address) and referee != empty(address), "input: operator and referee must be set"
    assert fee_bps_ <= BPS, "input: the fee must be at most 10000 basis points"
    # A whistleblower share of 0 leaves nobody a reason to report; one of
    # 10000 lets a cheat that reports itself keep its whole stake.
    assert whistleblower_bps_ > 0 and whistleblower_bps_ < BPS, "input: the whistleblower share must be 1 to 9999 basis points"
    assert min_stake_ > 0, "input: min_stake must be nonzero, or a lease's collateral can be nothing"
    assert min_bond_ > 0, "input: min_bond must be nonzero, or disputes are free to spam"
    # No bond above what the contract can hold could ever be posted; below it,
    # REWARD_BONDS x min_bond cannot overflow.
    assert min_bond_ <= MAX_HELD, "input: min_bond must be at most 2**85-1 wei"
    # With no window a cheat is paid the moment its job settles.
    assert dispute_window_s_ > 0 and dispute_timeout_s_ > 0 and silence_timeout_s_ > 0, "input: the dispute window and the timeouts must be nonzero"
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
    dispute_timeout_s = dispute_timeout_s_


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


# ---------------------------------------------------------------- lease words
@internal
@pure
def _earned(lease: uint256) -> uint256:
    return (lease & PRICE_MASK) * ((lease >> BOOKED_SHIFT) & SECONDS_MASK)


@internal
@view
def _collateral(lease: uint256) -> uint256:
    # The most the lease can ever earn, and never less than min_stake.
    return max((lease & PRICE_MASK) * ((lease >> TERM_SHIFT) & SECONDS_MASK), min_stake)


@internal
@pure
def _accepted_at(lease: uint256) -> uint256:
    return (lease >> ACCEPTED_SHIFT) & SECONDS_MASK


@internal
@pure
def _locked(word: uint256) -> uint256:
    return (word >> LOCKED_SHIFT) & STAKE_MASK


@internal
def _credit(account: address, amount: uint256):
    # Below 2**85 (MAX_HELD), as the field it adds to: no carry out.
    self.accounts[account] += amount << CREDIT_SHIFT


@internal
@view
def _check_held():
    # Every field of an account word is at most what the contract holds.
    assert self.balance <= MAX_HELD, "funds: the contract holds at most 2**85-1 wei"


# ---------------------------------------------------------------- jobs
# Job members are read one by one: copying the whole struct would cost a
# cold load for each of its slots.
@internal
@view
def _require_open(job: uint256):
    assert self.jobs[job].submitter != empty(address), "state: no such job"
    assert self.jobs[job].settled_at == 0, "state: job is already settled"


@internal
@view
def _in_window(job: uint256) -> bool:
    settled_at: uint256 = self.jobs[job].settled_at
    return settled_at == 0 or block.timestamp < settled_at + dispute_window_s


@external
@payable
def create_job(max_price: uint256) -> uint256:
    assert msg.value > 0, "funds: a job needs a nonzero escrow deposit"
    assert max_price > 0 and max_price <= PRICE_MASK, "input: max price must be 1 to 2**96-1 wei per second"
    self._check_held()
    job: uint256 = self.job_count + 1
    self.job_count = job
    self.jobs[job] = Job(
        submitter=msg.sender,
        max_price=max_price,
        escrow=msg.value,
        owed=0,
        fee=0,
        fee_bps=fee_bps,
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
    self._check_held()
    self.jobs[job].escrow += msg.value
    log JobFunded(job=job, submitter=msg.sender, amount=msg.value, max_price=self.jobs[job].max_price)


@internal
@view
def _new_lease(job: uint256, provider: address, price: uint256, term_s: uint256, max_price: uint256) -> uint256:
    assert provider != empty(address), "input: provider must be a nonzero address"
    assert price > 0 and price <= max_price, "input: lease price must be 1 wei/s up to the job's max price"
    assert term_s > 0 and term_s <= SECONDS_MASK, "input: lease term must be 1 to 2**40-1 seconds"
    assert self.leases[job][provider] == 0, "state: provider already has a lease on this job"
    return price | (term_s << TERM_SHIFT) | LEASE_OPEN


@internal
def _lock(provider: address, lease: uint256) -> uint256:
    # Locks the lease's collateral out of free stake; 0 if there is too little.
    collateral: uint256 = self._collateral(lease)
    word: uint256 = self.accounts[provider]
    if self._locked(word) + collateral > word & STAKE_MASK:
        return 0
    self.accounts[provider] = word + (collateral << LOCKED_SHIFT)
    return collateral


@external
def open_leases(job: uint256, providers: DynArray[address, MAX_BATCH], prices: DynArray[uint256, MAX_BATCH], terms_s: DynArray[uint256, MAX_BATCH]):
    # Offers: each provider must still `accept` its lease before it is billed.
    assert msg.sender == self.operator, "role: only the operator may open leases"
    self._require_open(job)
    assert len(providers) == len(prices) and len(prices) == len(terms_s), "input: providers, prices and terms differ in length"
    max_price: uint256 = self.jobs[job].max_price
    locked: DynArray[uint256, MAX_BATCH] = []
    for i: uint256 in range(len(providers), bound=MAX_BATCH):
        self.leases[job][providers[i]] = self._new_lease(job, providers[i], prices[i], terms_s[i], max_price)
        locked.append(0)
    log LeaseOpened(job=job, provider=providers, price=prices, term_s=terms_s, locked=locked)
    self.jobs[job].last_active = block.timestamp


@internal
@view
def _domain_separator() -> bytes32:
    # Computed per call, so that a signature for one fork of a chain does not
    # open leases on the other.
    return keccak256(abi_encode(DOMAIN_TYPEHASH, DOMAIN_NAME_HASH, DOMAIN_VERSION_HASH, chain.id, self))


@internal
@pure
def _acceptance_digest(domain: bytes32, job: uint256, provider: address, price: uint256, term_s: uint256, deadline: uint256) -> bytes32:
    fields: bytes32 = keccak256(abi_encode(ACCEPTANCE_TYPEHASH, job, provider, price, term_s, deadline))
    return keccak256(concat(b"\x19\x01", domain, fields))


@external
@view
def acceptance_digest(job: uint256, provider: address, price: uint256, term_s: uint256, deadline: uint256) -> bytes32:
    """@notice The EIP-712 digest a provider signs to accept these terms here."""
    return self._acceptance_digest(self._domain_separator(), job, provider, price, term_s, deadline)


@external
def open_accepted_leases(job: uint256, acceptances: DynArray[Acceptance, MAX_BATCH]):
    # Leases the providers accepted by signature: no transaction of their own.
    # A lease whose provider lacks the free stake now opens only offered (it
    # may `accept` later), so unbonding after signing cannot revert the batch.
    assert msg.sender == self.operator, "role: only the operator may open leases"
    self._require_open(job)
    max_price: uint256 = self.jobs[job].max_price
    domain: bytes32 = self._domain_separator()
    providers: DynArray[address, MAX_BATCH] = []
    prices: DynArray[uint256, MAX_BATCH] = []
    terms_s: DynArray[uint256, MAX_BATCH] = []
    locks: DynArray[uint256, MAX_BATCH] = []
    for a: Acceptance in acceptances:
        lease: uint256 = self._new_lease(job, a.provider, a.price, a.term_s, max_price)
        assert block.timestamp <= a.deadline, "time: the provider's signed acceptance has expired"
        assert convert(a.s, uint256) <= HALF_CURVE_ORDER, "input: signature s must be in the lower half of the curve order"
        fields: bytes32 = keccak256(abi_encode(ACCEPTANCE_TYPEHASH, job, a.provider, a.price, a.term_s, a.deadline))
        digest: bytes32 = keccak256(concat(b"\x19\x01", domain, fields))
        assert ecrecover(digest, a.v, a.r, a.s) == a.provider, "role: the acceptance is not signed by the lease's provider"
        # Inline `_lock`: the stake word is read and written once.
        collateral: uint256 = max(unsafe_mul(a.price, a.term_s), min_stake)
        word: uint256 = self.accounts[a.provider]
        locked: uint256 = 0
        if self._locked(word) + collateral <= word & STAKE_MASK:
            self.accounts[a.provider] = word + (collateral << LOCKED_SHIFT)
            lease |= block.timestamp << ACCEPTED_SHIFT
            locked = collateral
        self.leases[job][a.provider] = lease
        providers.append(a.provider)
        prices.append(a.price)
        terms_s.append(a.term_s)
        locks.append(locked)
    log LeaseOpened(job=job, provider=providers, price=prices, term_s=terms_s, locked=locks)
    self.jobs[job].last_active = block.timestamp


@external
def accept(job: uint256):
    # The provider agrees to the lease's terms and stakes on them.
    self._require_open(job)
    lease: uint256 = self.leases[job][msg.sender]
    assert lease & LEASE_OPEN != 0, "state: no lease for this provider on this job"
    assert self._accepted_at(lease) == 0, "state: lease is already accepted"
    locked: uint256 = self._lock(msg.sender, lease)
    assert locked != 0, "funds: free stake is below the lease's collateral"
    self.leases[job][msg.sender] = lease | (block.timestamp << ACCEPTED_SHIFT)
    log LeaseAccepted(job=job, provider=msg.sender, locked=locked)


@external
def anchor(job: uint256, epoch: uint256, root: bytes32):
    assert msg.sender == self.operator, "role: only the operator may anchor roots"
    self._require_open(job)
    assert epoch == self.jobs[job].epochs, "state: epochs must be anchored in order, once each"
    assert epoch < EPOCH_MASK, "input: too many epochs"
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
    owed: uint256 = self.jobs[job].owed
    fee: uint256 = self.jobs[job].fee
    for i: uint256 in range(len(providers), bound=MAX_BATCH):
        provider: address = providers[i]
        lease: uint256 = self.leases[job][provider]
        assert lease & LEASE_OPEN != 0, "state: provider has no lease on this job"
        assert lease & LEASE_SLASHED == 0, "state: provider was slashed on this job"
        accepted_at: uint256 = self._accepted_at(lease)
        assert accepted_at != 0, "state: provider has not accepted this lease"
        assert epoch >= (lease >> EPOCH_SHIFT) & EPOCH_MASK, "state: work is already booked for this epoch (or a later one)"
        before: uint256 = (lease >> BOOKED_SHIFT) & SECONDS_MASK
        booked: uint256 = before + seconds[i]
        assert booked <= block.timestamp - accepted_at, "input: more seconds than have passed since the lease was accepted"
        assert booked <= (lease >> TERM_SHIFT) & SECONDS_MASK, "input: more seconds than the lease's term"
        self.leases[job][provider] = (lease & BOOK_KEEP) | (booked << BOOKED_SHIFT) | ((epoch + 1) << EPOCH_SHIFT)
        # Bounded, so unchecked: price < 2**96, booked <= term < 2**40, fee_bps <= 10**4.
        price: uint256 = lease & PRICE_MASK
        # The fee is reserved per lease as it will be paid, rounding included.
        fee = unsafe_add(fee, unsafe_div(unsafe_mul(unsafe_mul(price, booked), fee_bps), BPS) - unsafe_div(unsafe_mul(unsafe_mul(price, before), fee_bps), BPS))
        owed = unsafe_add(owed, unsafe_mul(price, seconds[i]))
    log WorkBooked(job=job, epoch=epoch, provider=providers, seconds=seconds)
    # The fee rides on top of the providers' pay, so escrow must cover both.
    assert owed + fee <= self.jobs[job].escrow, "funds: escrow cannot cover this work; fund the job"
    self.jobs[job].owed = owed
    self.jobs[job].fee = fee
    self.jobs[job].last_active = block.timestamp


@internal
def _close(job: uint256, by_submitter: bool):
    owed: uint256 = self.jobs[job].owed
    fee: uint256 = self.jobs[job].fee
    if by_submitter:
        # A silent operator forfeits its fee; booked work is still paid.
        fee = 0
        self.jobs[job].fee = 0
        self.jobs[job].fee_bps = 0
    refund: uint256 = self.jobs[job].escrow - owed - fee
    self.jobs[job].settled_at = block.timestamp
    if refund > 0:
        self._credit(self.jobs[job].submitter, refund)
    log JobSettled(job=job, owed=owed, fee=fee, refund=refund, by_submitter=by_submitter)


@external
def settle(job: uint256):
    # O(1) in the number of providers: their pay and the fee on it stay in
    # the contract and each lease is released by `payout` or `claim`.
    assert msg.sender == self.operator, "role: only the operator may settle a job"
    self._require_open(job)
    self._close(job, False)


@external
def reclaim(job: uint256):
    self._require_open(job)
    # A provider may close the job too, or its collateral would stay locked
    # for as long as the operator and the submitter both stay silent.
    allowed: bool = msg.sender == self.jobs[job].submitter or self.leases[job][msg.sender] & LEASE_OPEN != 0
    assert allowed, "role: only the job's submitter or one of its providers may reclaim it"
    assert block.timestamp > self.jobs[job].last_active + silence_timeout_s, "time: the operator is not yet silent past the deadline"
    self._close(job, True)


# ---------------------------------------------------------------- paying providers
@internal
def _release(job: uint256, provider: address, lease: uint256) -> uint256:
    # Clearing the word refunds most of its write cost and marks it paid;
    # unlocking the collateral and crediting the earnings is one write.
    self.leases[job][provider] = 0
    amount: uint256 = self._earned(lease)
    if self._accepted_at(lease) != 0:
        self.accounts[provider] = self.accounts[provider] - (self._collateral(lease) << LOCKED_SHIFT) + (amount << CREDIT_SHIFT)
    return amount


@internal
@view
def _require_payable_job(job: uint256):
    settled_at: uint256 = self.jobs[job].settled_at
    assert settled_at != 0, "state: job is not settled yet"
    assert block.timestamp >= settled_at + dispute_window_s, "time: earnings are paid after the job's dispute window"


@internal
def _credit_fee(job: uint256, amount: uint256):
    fee: uint256 = amount * self.jobs[job].fee_bps // BPS
    if fee > 0:
        self._credit(self.operator, fee)


@external
def payout(job: uint256, providers: DynArray[address, MAX_BATCH]):
    # Anyone may credit providers their earnings (each withdraws when it
    # likes); nothing is sent, so no recipient can re-enter or refuse. Only
    # after the window, so a credited lease can no longer be slashed. Leases
    # that cannot be paid (paid already, slashed, disputed) are skipped, so
    # one front-run claim cannot revert a whole batch.
    self._require_payable_job(job)
    paid: DynArray[address, MAX_BATCH] = []
    amounts: DynArray[uint256, MAX_BATCH] = []
    fee_bps_: uint256 = self.jobs[job].fee_bps
    fees: uint256 = 0
    for provider: address in providers:
        lease: uint256 = self.leases[job][provider]
        if lease & (LEASE_OPEN | LEASE_DISPUTED | LEASE_SLASHED) != LEASE_OPEN:
            continue
        amount: uint256 = self._release(job, provider, lease)
        # Bounded: amount = price x booked seconds < 2**136, fee_bps <= 10**4.
        # The fee is per lease, as it was reserved when its work was booked.
        fees = unsafe_add(fees, unsafe_div(unsafe_mul(amount, fee_bps_), BPS))
        paid.append(provider)
        amounts.append(amount)
    if fees > 0:
        self._credit(self.operator, fees)
    log Paid(job=job, provider=paid, amount=amounts)


@external
def claim(job: uint256):
    self._require_payable_job(job)
    lease: uint256 = self.leases[job][msg.sender]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was slashed on this job and is not paid for it"
    assert lease & LEASE_DISPUTED == 0, "state: a dispute on this lease is open"
    amount: uint256 = self._release(job, msg.sender, lease)
    self._credit_fee(job, amount)
    log Paid(job=job, provider=[msg.sender], amount=[amount])


@external
def withdraw():
    # All of the account's credit, however many jobs' earnings it collects.
    word: uint256 = self.accounts[msg.sender]
    amount: uint256 = word >> CREDIT_SHIFT
    assert amount > 0, "funds: nothing to withdraw"
    self.accounts[msg.sender] = word & (2**CREDIT_SHIFT - 1)
    log Withdrawn(account=msg.sender, amount=amount)
    raw_call(msg.sender, b"", value=amount)


# ---------------------------------------------------------------- stakes
@external
@payable
def stake():
    assert msg.value > 0, "funds: send a nonzero amount to stake"
    self._check_held()  # so the active field cannot overflow
    self.accounts[msg.sender] += msg.value
    log Staked(provider=msg.sender, amount=msg.value)


@external
def unbond(amount: uint256):
    assert amount > 0, "input: unbond a nonzero amount"
    word: uint256 = self.accounts[msg.sender]
    assert amount + self._locked(word) <= word & STAKE_MASK, "funds: cannot unbond locked or unstaked stake"
    self.accounts[msg.sender] = word - amount
    self.unbonding[msg.sender] += amount
    # A new request restarts the delay.
    release: uint256 = block.timestamp + unbonding_delay_s
    self.release_at[msg.sender] = release
    log UnbondRequested(provider=msg.sender, amount=amount, release_at=release)


@external
def release_stake():
    amount: uint256 = self.unbonding[msg.sender]
    assert amount > 0, "state: no stake is unbonding"
    assert block.timestamp >= self.release_at[msg.sender], "time: stake is still unbonding"
    self.unbonding[msg.sender] = 0
    self._credit(msg.sender, amount)
    log StakeReleased(provider=msg.sender, amount=amount)


# ---------------------------------------------------------------- slashing and disputes
@internal
def _end_disputes(job: uint256, provider: address, state: uint256):
    # Every still-open dispute of a slashed lease gets its bond back.
    for d: uint256 in self.lease_disputes[job][provider]:
        self.disputes[d].state = state
        challenger: address = self.disputes[d].challenger
        self._credit(challenger, self.disputes[d].bond)
        log DisputeClosed(dispute=d, state=state, bond_to=challenger)
    self.lease_disputes[job][provider] = []


@internal
@view
def _reward(taken: uint256) -> uint256:
    # The first to show the evidence may be the cheat's own sock (the cheat
    # knows where it cheated), and an upheld bond comes back, so a cheat gets
    # back whatever this pays. Capped, a cheat that reports itself loses its
    # collateral C less min(C x share, REWARD_BONDS x min_bond): more than 0,
    # as the share is below the whole, and all but two bonds of any lease. An
    # honest challenger risks one bond to win up to REWARD_BONDS of them.
    # Unchecked: taken < 2**85 (MAX_HELD), whistleblower_bps < 10**4, and
    # min_bond <= MAX_HELD (the constructor's check).
    return min(unsafe_div(unsafe_mul(taken, whistleblower_bps), BPS), unsafe_mul(REWARD_BONDS, min_bond))


@internal
def _slash(job: uint256, provider: address, whistleblower: address):
    lease: uint256 = self.leases[job][provider]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was already slashed on this job"
    assert self._accepted_at(lease) != 0, "state: provider never accepted this lease"
    # The lease's collateral is locked, so it is all there to take.
    taken: uint256 = self._collateral(lease)
    self.accounts[provider] -= (taken << LOCKED_SHIFT) + taken  # out of locked and active stake
    reward: uint256 = self._reward(taken)
    self._credit(whistleblower, reward)
    # The cheat forfeits its pay for this job and the operator its fee on
    # it: both go back to the submitter, through the escrow while the job is
    # open, as a credit once settled.
    forfeited: uint256 = self._earned(lease)
    fee: uint256 = forfeited * self.jobs[job].fee_bps // BPS
    self.jobs[job].owed -= forfeited
    self.jobs[job].fee -= fee
    to_submitter: uint256 = taken - reward
    if self.jobs[job].settled_at != 0:
        to_submitter += forfeited + fee
    self._credit(self.jobs[job].submitter, to_submitter)
    self.leases[job][provider] = (lease | LEASE_SLASHED) & ~LEASE_DISPUTED
    log Slashed(job=job, provider=provider, amount=taken, whistleblower=whistleblower, reward=reward, forfeited=forfeited)


@external
def slash(job: uint256, provider: address, whistleblower: address):
    # Goes through whatever disputes are open: front-running the referee
    # with a dispute from an account the cheat controls gains it nothing.
    assert msg.sender == self.referee, "role: only the referee may slash"
    assert whistleblower != empty(address), "input: whistleblower must be a nonzero address"
    assert self._in_window(job), "time: the job's dispute window has closed"
    self._slash(job, provider, whistleblower)
    self._end_disputes(job, provider, DISPUTE_SUPERSEDED)


@external
def slash_verifier(verifier: address, amount: uint256, whistleblower: address):
    # A verifier bonds its audits with stake: one that signed `valid` on a
    # forced error (a wrong record the operator planted) loses up to `amount`
    # of it, part to whoever showed it, the rest to the treasury. Unbonding
    # stake is taken too, so a verifier cannot run from a slash; stake locked
    # by the verifier's own leases is left to answer for those leases.
    assert msg.sender == self.referee, "role: only the referee may slash"
    assert whistleblower not in [empty(address), verifier], "input: bad whistleblower"
    word: uint256 = self.accounts[verifier]
    taken: uint256 = min(amount, (word & STAKE_MASK) - self._locked(word))
    self.accounts[verifier] = word - taken
    unbonding: uint256 = min(amount - taken, self.unbonding[verifier])
    self.unbonding[verifier] -= unbonding
    taken += unbonding
    assert taken > 0, "state: no unlocked stake"
    reward: uint256 = self._reward(taken)
    self._credit(whistleblower, reward)
    self._credit(self.owner, taken - reward)
    log VerifierSlashed(verifier=verifier, amount=taken, whistleblower=whistleblower, reward=reward)


@external
@payable
def open_dispute(job: uint256, provider: address) -> uint256:
    assert msg.value >= min_bond, "funds: a dispute needs a bond of at least min_bond"
    self._check_held()
    assert self.jobs[job].submitter != empty(address), "state: no such job"
    assert self._in_window(job), "time: the job's dispute window has closed"
    lease: uint256 = self.leases[job][provider]
    assert lease & LEASE_OPEN != 0, "state: provider has no unpaid lease on this job"
    assert lease & LEASE_SLASHED == 0, "state: provider was already slashed on this job"
    assert self._accepted_at(lease) != 0, "state: provider never accepted this lease"
    # The last slot is the referee's: its own finding can still hold the pay
    # (past the window, until it rules), whatever socks filled the others.
    assert len(self.lease_disputes[job][provider]) < MAX_OPEN_DISPUTES - 1 or msg.sender == self.referee, "state: too many open disputes on this lease"
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
    self.lease_disputes[job][provider].append(dispute)
    self.leases[job][provider] = lease | LEASE_DISPUTED
    log DisputeOpened(dispute=dispute, job=job, provider=provider, challenger=msg.sender, bond=msg.value)
    return dispute


@internal
def _drop_dispute(dispute: uint256, state: uint256, bond_to: address):
    d: Dispute = self.disputes[dispute]
    self.disputes[dispute].state = state
    self._credit(bond_to, d.bond)
    rest: DynArray[uint256, MAX_OPEN_DISPUTES] = []
    for other: uint256 in self.lease_disputes[d.job][d.provider]:
        if other != dispute:
            rest.append(other)
    self.lease_disputes[d.job][d.provider] = rest
    if len(rest) == 0:
        self.leases[d.job][d.provider] &= ~LEASE_DISPUTED
    log DisputeClosed(dispute=dispute, state=state, bond_to=bond_to)


@external
def resolve_dispute(dispute: uint256, upheld: bool):
    assert msg.sender == self.referee, "role: only the referee may resolve disputes"
    d: Dispute = self.disputes[dispute]
    assert d.state == DISPUTE_OPEN, "state: no open dispute with this id"
    # Oldest first: a later copy of the same evidence cannot take the reward.
    assert self.lease_disputes[d.job][d.provider][0] == dispute, "state: decide this lease's earlier dispute first"
    if upheld:
        self._drop_dispute(dispute, DISPUTE_UPHELD, d.challenger)
        self._slash(d.job, d.provider, d.challenger)
        self._end_disputes(d.job, d.provider, DISPUTE_SUPERSEDED)
    else:
        # The bond pays for a false accusation, to the treasury: paying the
        # accused would let a cheat dispute itself for free.
        self._drop_dispute(dispute, DISPUTE_REJECTED, self.owner)


@external
def expire_dispute(dispute: uint256):
    # A silent referee must not freeze a provider's pay forever; the
    # challenger did nothing wrong, so it gets its bond back.
    assert self.disputes[dispute].state == DISPUTE_OPEN, "state: no open dispute with this id"
    assert block.timestamp > self.disputes[dispute].opened_at + dispute_timeout_s, "time: the referee may still resolve this dispute"
    self._drop_dispute(dispute, DISPUTE_EXPIRED, self.disputes[dispute].challenger)
