"""`--log-json`: each log line is one JSON object a collector can parse."""

from __future__ import annotations

import json
import logging

from shoal.cli.log_format import JsonLines


def test_a_log_record_is_one_json_line_with_its_exception():
    try:
        raise ValueError("bad value")
    except ValueError:
        import sys

        record = logging.LogRecord("shoal.coordinator", logging.ERROR, __file__, 1,
                                   "round %d failed", (7,), sys.exc_info())
    line = JsonLines().format(record)
    assert "\n" not in line.split('"exception"')[0]
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and entry["logger"] == "shoal.coordinator"
    assert entry["message"] == "round 7 failed" and "ValueError: bad value" in entry["exception"]
