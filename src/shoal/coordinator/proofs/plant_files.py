"""A forced error's file: a worker's revealed contribution, scaled by a factor drawn
from the operator's secret, saved the way the worker saved the real one (a safetensors
file's header names only the tensors' shapes and dtypes, which scaling keeps: the
plant's is the real one's, byte for byte).

Scaling keeps every cheap property a verifier might screen with (shapes, dtype,
the zero pattern of sparse gradients such as an embedding's, the direction, the
correlation with peers' contributions) and moves the values a few tolerances
away, so only a replay tells it from the real one.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from shoal.spec.proof import WorkRecord

_SCALE = 2.0**64
# The plant is this many tolerances from the real contribution (drawn per record): an
# honest replay lands within one tolerance of the real one, so at least three from it.
MIN_TOLERANCES, MAX_TOLERANCES = 4.0, 8.0


def plant_factor(secret: bytes, record: WorkRecord, tolerance: float) -> float:
    """What the planted contribution is the real one times (drawn from the secret, so the
    reveal shows the operator did not choose it after seeing verdicts)."""
    item = json.dumps([record.job, record.worker, record.step, "scale"], separators=(",", ":"))
    draw = hmac.new(secret, item.encode(), hashlib.sha256).digest()
    u = int.from_bytes(draw[:8], "big") / _SCALE
    shift = (MIN_TOLERANCES + (MAX_TOLERANCES - MIN_TOLERANCES) * u) * max(tolerance, 1e-3)
    # Down or up at random, so the norm says nothing; never down to zero or below.
    return 1.0 - shift if draw[8] & 1 and shift < 0.5 else 1.0 + shift


def planted_reveal(data: bytes, record: WorkRecord, secret: bytes,
                   tolerance: float) -> tuple[WorkRecord, bytes] | None:
    """The record as served (re-committed) and the file served for it, or None when the
    worker's file cannot make a sound plant: it does not load, does not open the record's
    commitment (then the record is served as it is, and a replay finds the cheat), or
    scaling would not move it past the tolerance (low-precision values)."""
    from shoal.verify.kept_files import UnreadableFile, reveal_from, reveal_like
    from shoal.verify.proof_store import contribution_norm, contribution_sha256
    from shoal.verify.replay import relative_distance

    try:
        real = reveal_from(data)
    except UnreadableFile:  # no plant: the record stays real
        return None
    if not real:
        return None
    opened = contribution_sha256(record.job, record.worker, record.step, real)
    if opened != record.contribution_sha256:
        return None
    factor = plant_factor(secret, record, tolerance)
    wrong = [(t.double() * factor).to(t.dtype) if t.is_floating_point() else t.clone()
             for t in real]
    if relative_distance(real, wrong) <= 3 * tolerance:
        return None  # an honest verifier could find it valid: it must not be a plant
    update = {"contribution_sha256": contribution_sha256(record.job, record.worker, record.step,
                                                         wrong),
              "contribution_norm": contribution_norm(wrong)}
    if record.exchanged is not None and record.rank < len(record.exchanged.sketches):
        # What the worker declared in the step's exchange is the plant's too (`with_plants`
        # puts it in every record of the step): else the cheap sketch check would find
        # every plant, and a verifier could skip replays and still catch them all.
        update["exchanged"] = _declaring(record, wrong)
    # Saved as the worker saved the real one: its header kept byte for byte (a worker
    # may lay its file out in any form the parser takes, and mark it for a colluding
    # verifier).
    return record.model_copy(update=update), reveal_like(data, wrong)


def _declaring(record: WorkRecord, wrong: list):
    from shoal.verify import sketch as sk

    exchanged = record.exchanged
    part = wrong[-1:] if record.local is not None else wrong  # DiLoCo: the pseudo-gradient
    sketches = list(exchanged.sketches)
    sketches[record.rank] = sk.finite(sk.sketch(exchanged.seed, part)[0])
    return exchanged.model_copy(update={"sketches": tuple(sketches)})


def with_plants(records: list[WorkRecord], plants: dict[tuple[str, int], WorkRecord]
                ) -> list[WorkRecord]:
    """An epoch's records as served: each plant in its worker's place, and its declared
    sketch in every record of its step (the audit reads a row by majority)."""
    rows = {(p.step, p.membership_epoch, p.rank): p.exchanged.sketches[p.rank]
            for p in plants.values()
            if p.exchanged is not None and p.rank < len(p.exchanged.sketches)}
    planted_steps = {(step, epoch) for step, epoch, _ in rows}
    served = []
    for record in records:
        record = plants.get((record.worker, record.step), record)
        exchanged = record.exchanged
        if exchanged is not None and (record.step, record.membership_epoch) in planted_steps:
            sketches = tuple(rows.get((record.step, record.membership_epoch, rank), row)
                             for rank, row in enumerate(exchanged.sketches))
            record = record.model_copy(update={
                "exchanged": exchanged.model_copy(update={"sketches": sketches})})
        served.append(record)
    return served
