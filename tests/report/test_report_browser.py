"""A real browser opens the report from disk: headless Chromium renders it, without console errors.

Chromium is Debian's `chromium`, installed by the `chromium` fixture where apt-get runs as root,
and the test is skipped with the reason elsewhere. The page has no scripts, so any console message
about it is a fault; a planted page with a script error proves the check sees such messages.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from PIL import Image

from torchpace.report import write_report
from torchpace.report.load import load_report_data

_TIMEOUT_S = 120
_MIN_COLOURS = 16  # text, charts and panels: a rendered report has far more; a blank or error page has 1-3
_MIN_INK_FRAC = 0.02  # at least 2% of the pixels are not the white background


def run_chromium(chromium: str, page: Path, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess:
    """Headless Chromium on `page` (a file:// URL), offline-minded flags, its own throw-away profile."""
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *mode,
            page.resolve().as_uri()]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, env=env, cwd=tmp_path)


def console_messages(stderr: str, page: Path) -> list[str]:
    """Console lines Chromium logged about `page` (errors, uncaught exceptions, console.* calls)."""
    return [line for line in stderr.splitlines()
            if re.search(r"CONSOLE|Uncaught", line) and page.name in line]


def screenshot(chromium: str, page: Path, tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess]:
    png = tmp_path / f"{page.stem}.png"
    done = run_chromium(chromium, page, tmp_path, f"--screenshot={png}", "--window-size=1280,2000")
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return png, done


def test_the_console_check_sees_a_script_error(chromium, tmp_path):
    page = tmp_path / "planted.html"
    page.write_text("<!DOCTYPE html><title>planted</title><p>x</p><script>throw new Error('planted')</script>")
    _, done = screenshot(chromium, page, tmp_path)
    assert any("planted" in line for line in console_messages(done.stderr, page))


def test_chromium_renders_the_study_report_from_disk(chromium, tuned_study, tmp_path):
    page = write_report(load_report_data(str(tuned_study.db)), tmp_path / "report.html", with_doctor=True)
    png, done = screenshot(chromium, page, tmp_path)
    assert console_messages(done.stderr, page) == []
    with Image.open(png) as image:
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        ink = sum(count for count, colour in colours if colour != (255, 255, 255)) / (rgb.width * rgb.height)
    assert len(colours) >= _MIN_COLOURS and ink >= _MIN_INK_FRAC, (len(colours), ink)
    dom = run_chromium(chromium, page, tmp_path, "--dump-dom")
    assert "<title>torchpace tune report: raises_with_two_workers</title>" in dom.stdout
    assert dom.stdout.count("<svg") == 4
