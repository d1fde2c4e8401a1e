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
