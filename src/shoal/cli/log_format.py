"""Log lines as JSON objects (`--log-json` or SHOAL_LOG_JSON=1), one per line,
for services whose logs a collector parses: time, level, logger, message,
and the exception if there is one."""

from __future__ import annotations

import json
import logging
import time


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"t": round(record.created, 3),
                 "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
                 "level": record.levelname, "logger": record.name,
                 "message": record.getMessage(), "pid": record.process}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(verbose: bool, as_json: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if as_json else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for chatty in ("httpx", "httpcore", "alembic"):  # a line per request or migration step
        logging.getLogger(chatty).setLevel(logging.WARNING)
