"""JSON-lines files read while they are written: a reader takes whole lines only, and
picks up from where it stopped."""

from shoal import jsonl


def test_a_line_being_written_is_read_once_it_ends(tmp_path):
    path = tmp_path / "records" / "w0.jsonl"
    jsonl.append(path, '{"step": 0}', '{"step": 1}')
    with path.open("a") as half:
        half.write('{"st')  # a writer caught mid-line
    lines, end = jsonl.read(path)
    assert lines == ['{"step": 0}', '{"step": 1}'] and end == len('{"step": 0}\n{"step": 1}\n')
    with path.open("a") as rest:
        rest.write('ep": 2}\n')
    assert jsonl.read(path, end) == (['{"step": 2}'], path.stat().st_size)


def test_a_missing_file_has_no_lines(tmp_path):
    assert jsonl.read(tmp_path / "a.jsonl", 7) == ([], 7)


def test_a_file_another_party_writes_is_read_a_bounded_piece_at_a_time(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 10 + b"x" * 100 + b"\n" + b'{"b": 2}\n')
    lines, offset = jsonl.read(path, 0, limit=50)
    assert lines == ['{"a": 1}'] * 5 and offset == 45
    # A line longer than the limit is skipped, not waited on for ever.
    start = 90
    lines, offset = jsonl.read(path, start, limit=50)
    assert lines == [] and offset == start + 50


def test_a_link_is_not_followed_when_reading_another_partys_file(tmp_path):
    secret = tmp_path / "agent.key"
    secret.write_text('{"the": "key"}\n')
    link = tmp_path / "steps.jsonl"
    link.symlink_to(secret)
    assert jsonl.read(link, 0, limit=1 << 20) == ([], 0)
    assert jsonl.read(link)[0] == ['{"the": "key"}']  # one's own files: as before
