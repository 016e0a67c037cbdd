"""The dashboard in a real browser: headless Chromium opens it against a daemon under load
(the token as HTTP Basic's password, as a person would type it), the page's charts and tables
hold data (read from the DOM the page's script built), the browser reports no violation of
the page's Content-Security-Policy (its console, on stderr), and a screenshot is saved as a
CI artifact (tests/artifacts/dashboard.png)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

from connector.daemon.client import DaemonStore
from tests.admin.conftest import TOKEN, AdminDaemon, namespace, pages

ARTIFACTS = Path(__file__).parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium's run; its stderr holds the page's console (a CSP violation is logged there)."""
    assert CHROMIUM, "chromium is missing: scripts/test.sh installs it (scripts/system_deps.sh)"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=4000", "--window-size=1280,1000", "--enable-logging=stderr",
         "--v=0", *args, url],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_dashboard_shows_live_data_in_headless_chromium(tmp_path: Path) -> None:
    stop = threading.Event()
    with AdminDaemon(tmp_path, host="160KiB", disk="4MiB", write_policy="write_back") as d:
        def traffic() -> None:  # two tenants writing and reading until the browser is done
            spaces = [namespace("alpha"), namespace("beta")]
            clients = [DaemonStore(d.target, ns.id) for ns in spaces]
            i = 0
            try:
                while not stop.is_set() and i < 400:
                    ns, c = spaces[i % 2], clients[i % 2]
                    chain = ns.chain(list(range(i * 64, i * 64 + 64)))
                    c.write_pages(chain.metas(), pages(4, i))
                    c.read_pages(list(chain.keys), pages(4, 0))
                    if i > 4:  # and an older prompt again: hits below host
                        old = ns.chain(list(range((i - 4) * 64, (i - 4) * 64 + 64)))
                        c.read_pages(list(old.keys), pages(4, 0))
                    i += 1
                    stop.wait(0.05)
            finally:
                for c in clients:
                    c.close()

        t = threading.Thread(target=traffic)
        t.start()
        try:
            stop.wait(2)  # a few samples of history first
            url = d.url.replace("http://", f"http://admin:{TOKEN}@") + "/"
            opened = chromium(url, "--dump-dom")
            dom = opened.stdout
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            shot.unlink(missing_ok=True)
            shown = chromium(url, f"--screenshot={shot}")
        finally:
            stop.set()
            t.join(60)
    points = dict(re.findall(r'id="(\w+)"[^>]*data-points="(\d+)"', dom))
    assert re.search(r'data-updates="[1-9]', dom), dom[-2000:]
    assert int(points["occupancy"]) == 2  # host and disk bars
    assert int(points["hitrate"]) > 0 and int(points["bandwidth"]) > 0
    assert int(points["namespaces"]) == 2  # alpha and beta
    assert int(points["removals"]) > 0  # the small host tier evicts
    occupancy = dom.split('id="occupancy"')[1].split("</section>")[0]
    widths = [float(w) for w in re.findall(r'class="fill" style="width: ([\d.]+)%;?"', occupancy)]
    assert len(widths) == 2 and widths[0] > 0, occupancy  # host's bar, set through the CSSOM
    for run in (opened, shown):  # everything the page does, its policy allows
        violations = [ln for ln in run.stderr.splitlines() if "Content Security Policy" in ln]
        assert violations == [], violations[:5]
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
