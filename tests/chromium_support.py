"""Debian's Chromium, as the real-browser tests launch it (through Playwright; never a browser Playwright downloads)."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
