"""Reading the kit's report pages back, as the report tests need: the pictures' data URIs,
the bars drawn in each SVG, the tables beside them, and a headless Chromium's view of a page."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


class Page(HTMLParser):
    """The figures of a page: per <figure>, its attributes, its image's data and its table's
    rows (their data- attributes)."""

    def __init__(self, text: str):
        super().__init__()
        self.figures, self.images, self.self_check, self.verdict = [], [], None, ""
        self._in_verdict = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self.figures.append({"attrs": attrs, "images": [], "rows": []})
        elif tag == "img":
            self.images.append(attrs)
            if self.figures:
                self.figures[-1]["images"].append(attrs)
        elif tag == "tr" and self.figures and "data-observed" in attrs:
            self.figures[-1]["rows"].append(attrs)
        elif tag == "p" and attrs.get("id") == "kit-self-check":
            self.self_check = attrs
        if attrs.get("id") == "verdict":
            self._in_verdict = True

    def handle_endtag(self, tag):
        if tag == "p":
            self._in_verdict = False

    def handle_data(self, data):
        if self._in_verdict:
            self.verdict += data


def svg_of(img: dict) -> ET.Element:
    prefix = "data:image/svg+xml;base64,"
    assert img["src"].startswith(prefix), img["src"][:60]
    return ET.fromstring(base64.b64decode(img["src"][len(prefix):]))


def bar_heights(svg: ET.Element, prefix: str = "obs-") -> dict[int, float]:
    """Height in points of each bar whose group id is PREFIX<i> (matplotlib writes a bar as a
    closed path of four corners)."""
    heights = {}
    for group in svg.iter("{http://www.w3.org/2000/svg}g"):
        gid = group.get("id", "")
        if not re.fullmatch(re.escape(prefix) + r"\d+", gid):
            continue
        path = next(group.iter("{http://www.w3.org/2000/svg}path"))
        ys = [float(v) for v in re.findall(r"[-\d.]+ ([-\d.]+)", path.get("d"))]
        heights[int(gid[len(prefix):])] = max(ys) - min(ys)
    return heights


def bar_colours(svg: ET.Element, prefix: str = "obs-") -> dict[int, str]:
    colours = {}
    for group in svg.iter("{http://www.w3.org/2000/svg}g"):
        gid = group.get("id", "")
        if re.fullmatch(re.escape(prefix) + r"\d+", gid):
            style = next(group.iter("{http://www.w3.org/2000/svg}path")).get("style", "")
            found = re.search(r"fill: ?(#[0-9a-f]{6})", style)
            colours[int(gid[len(prefix):])] = found.group(1) if found else ""
    return colours


def browser() -> str | None:
    named = os.environ.get("KIT_CHROMIUM")
    if named:
        return named if shutil.which(named) else None
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


def chromium(exe: str, page: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """One headless Chromium run on a local page (no sandbox: CI runs as root; no network
    is needed, the page is self-contained)."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", *args, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
