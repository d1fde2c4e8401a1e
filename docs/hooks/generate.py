"""MkDocs hook: the pages generated from the code and the bench results at build time
(reference/cli.md, reference/job-file.md, reference/http-api.md, figures.md).

They are never committed, so they cannot go stale; a committed file of the same name
would be replaced here, and the build says so.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from page_cli import cli_page
from page_figures import figures_page
from page_http import http_page
from page_jobfile import jobfile_page

log = logging.getLogger("mkdocs.hooks.shoal")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    repo = Path(config.config_file_path).resolve().parent
    pages = {
        "reference/cli.md": cli_page,
        "reference/job-file.md": jobfile_page,
        "reference/http-api.md": http_page,
        "figures.md": lambda: figures_page(repo / "bench" / "results"),
    }
    for uri, render in pages.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            log.warning("docs/%s is generated at build time: the committed copy is ignored", uri)
            files.remove(existing)
        files.append(File.generated(config, uri, content=render()))
    return files
