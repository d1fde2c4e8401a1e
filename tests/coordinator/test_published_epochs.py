"""Reading the membership epochs a job's host published, as the host writes them:
a line still being written is not an epoch yet, an epoch published after the
last read is found, and a file replaced by another is read afresh."""

from __future__ import annotations

import json

import pytest

from shoal.coordinator.errors import Conflict
from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from tests.coordinator.test_proofs import record


def line(epoch: int, members: list[str]) -> str:
    return json.dumps({"t": 1.0 + epoch, "epoch": epoch, "members": members,
                       "reason": "start" if epoch == 0 else "join"}) + "\n"


@pytest.fixture
def host(tmp_path):
    """The job's run directory and the coordinator's reader of it."""
    (tmp_path / "job-1").mkdir()
    return tmp_path / "job-1" / "epochs.jsonl", PublishedEpochs(lambda job: tmp_path / job)


def test_an_epoch_is_published_once_its_line_is_whole(host):
    path, published = host
    assert published.members("job-1", 0) is None  # no host has written yet
    path.write_text(line(0, ["w0"]))
    assert published.members("job-1", 0) == ("w0",)
    whole = line(1, ["w0", "w1"])
    with path.open("a") as log:
        log.write(whole[:20])  # the host is still writing it
    assert published.members("job-1", 1) is None
    with path.open("a") as log:
        log.write(whole[20:] + "not json\n" + line(2, ["w1"]))
    assert published.members("job-1", 1) == ("w0", "w1")
    assert published.members("job-1", 2) == ("w1",)
    assert published.members("job-1", 0) == ("w0",)  # what was read before is kept


def test_a_replaced_file_is_read_afresh(host):
    path, published = host
    path.write_text(line(0, ["w0", "w1"]) + line(1, ["w1"]))
    assert published.members("job-1", 1) == ("w1",)
    path.write_text(line(0, ["w2"]))  # shorter than what was read: another file
    assert published.members("job-1", 3) is None  # an unknown epoch: read again
    assert published.members("job-1", 0) == ("w2",)


def test_a_record_is_held_to_its_published_epoch(host):
    path, published = host
    path.write_text(line(0, ["w0", "w1"]))
    published.check("job-1", record("w1", 3, rank=1, shares=(4, 4)))  # as published
    for forged, field in ((record("w1", 3, rank=1, shares=(4, 4), epoch=1), "membership_epoch"),
                          (record("w1", 3, rank=0, shares=(4, 4)), "rank"),
                          (record("w2", 3, rank=1, shares=(4, 4)), "not a member"),
                          (record("w1", 3, rank=1, shares=(2, 2, 4)), "shares")):
        with pytest.raises(Conflict, match=field):
            published.check("job-1", forged)
