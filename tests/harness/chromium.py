"""Headless Chromium from Debian's packages (chromium, chromium-driver), driven
by Selenium, for testing the dashboard in a real browser. No browser is
downloaded: Selenium is handed Debian's binaries and told to stay offline."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness.installs import one_installer

BROWSER, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
INSTALL_HINT = ("Debian's Chromium not found (/usr/bin/chromium, /usr/bin/chromedriver); install "
                "it with: apt-get install -y --no-install-recommends chromium chromium-driver")


def find_chromium() -> tuple[Path, Path]:
    """Debian's browser and its matching driver, installing the packages if we can."""
    if not (BROWSER.is_file() and DRIVER.is_file()) and os.geteuid() == 0 \
            and shutil.which("apt-get"):
        with one_installer("apt"):
            if not (BROWSER.is_file() and DRIVER.is_file()):  # another test may have, meanwhile
                env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
                install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium",
                           "chromium-driver"]
                # A fresh image has no package lists; only then is the slow update worth it.
                if subprocess.run(install, env=env, capture_output=True).returncode != 0:
                    subprocess.run(["apt-get", "update"], env=env, capture_output=True)
                    subprocess.run(install, env=env, capture_output=True)
    if not (BROWSER.is_file() and DRIVER.is_file()):
        raise RuntimeError(INSTALL_HINT)
    return BROWSER, DRIVER


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1000) -> Iterator[object]:
    """A Selenium driver of a fresh headless Chromium, quit afterwards."""
    browser, driver_path = find_chromium()
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(browser)
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # to see the page's errors
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    driver = webdriver.Chrome(service=Service(str(driver_path)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows (RGB or RGBA, 8 bits) of a screenshot's PNG:
    enough to ask what colours it shows, with no imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and not interlace, f"unexpected PNG {header}"
    channels = 3 if colour == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * channels, []
    previous = bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 0xFF
        rows.append(bytes(line))
        previous = rows[-1]
    return width, height, rows
