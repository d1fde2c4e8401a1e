import numpy as np
import pytest

from shoal.spec import DataSpec
from shoal.models.corpus import load_corpus
from shoal.models.errors import CorpusError


def test_stdlib_corpus_is_split_by_file_and_capped():
    corpus = load_corpus(DataSpec(max_bytes=400_000), context=64)
    assert len(corpus.train) + len(corpus.val) == 400_000
    assert 0 < len(corpus.val) < len(corpus.train)
    assert corpus.files > 1
    again = load_corpus(DataSpec(max_bytes=400_000), context=64)
    assert np.array_equal(corpus.val, again.val)


def test_directory_and_single_file(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"line {i}\n" * 50)
    (tmp_path / "skip.bin").write_bytes(b"\x00" * 100)
    corpus = load_corpus(DataSpec(corpus=str(tmp_path), val_fraction=0.2), context=16)
    assert corpus.files == 40
    assert b"\x00" not in corpus.train.tobytes()

    single = tmp_path / "one.txt"
    single.write_text("abcdefgh" * 1000)
    corpus = load_corpus(DataSpec(corpus=str(single), val_fraction=0.1), context=16)
    assert len(corpus.val) == 800 and len(corpus.train) == 7200


def test_windows_are_input_and_next_byte_target(tmp_path):
    single = tmp_path / "one.txt"
    single.write_bytes(bytes(range(256)) * 8)
    corpus = load_corpus(DataSpec(corpus=str(single), val_fraction=0.1), context=8)
    windows = corpus.windows(np.array([0, 2]), 8)
    assert windows.shape == (2, 9)
    assert list(windows[1]) == list(range(16, 25))


def test_empty_missing_and_too_small(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(DataSpec(corpus=str(tmp_path / "nope")), context=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(DataSpec(corpus=str(tmp_path / "empty")), context=8)
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    with pytest.raises(CorpusError, match="too small"):
        load_corpus(DataSpec(corpus=str(small)), context=8)
