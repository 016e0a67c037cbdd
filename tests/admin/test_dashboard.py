"""The dashboard in a real browser: headless Chromium opens it against a daemon under load
(the token as HTTP Basic's password, as a person would type it), the page's charts and tables
hold data (read from the DOM the page's script built), the time-window selector sets the
charts' x range (opened at ``#window=60`` and ``#window=3600``, which set the selector and fire
its change event), consecutive evictions of a tier are one row, namespace ids are whole (in
the cell and its title) beside their label ('—' for none), the browser reports no violation of the page's
Content-Security-Policy (its console, on stderr), and a screenshot is saved as a CI artifact
(tests/artifacts/dashboard.png)."""

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
            clients[0].label_namespace(spaces[0].id, spaces[0].label)  # beta goes unlabelled
            i = 0
            try:
                while not stop.is_set() and i < 400:
                    ns, c = spaces[i % 2], clients[i % 2]
                    chain = ns.chain(list(range(i * 64, i * 64 + 64)))
                    c.write_pages(chain.metas(), pages(4, i))
                    c.lookup(list(chain.keys))  # as an engine's connector does, then loads
                    c.read_pages(list(chain.keys), pages(4, 0))
                    if i > 4:  # and an older prompt again: hits below host
                        old = ns.chain(list(range((i - 4) * 64, (i - 4) * 64 + 64)))
                        c.lookup(list(old.keys))
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
            minute, hour = (chromium(url + f"#window={w}", "--dump-dom") for w in (60, 3600))
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            shot.unlink(missing_ok=True)
            shown = chromium(url + "#window=60", f"--screenshot={shot}")
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
    # the window selector: the default (10 m), then 1 m and 1 h -- each sets the x range
    assert '<select id="window">' in dom
    ranges = {}
    for w, run in ((600, opened), (60, minute), (3600, hour)):
        page = run.stdout
        assert re.search(rf'<body[^>]*data-window="{w}"', page), page[:500]
        xrange = re.search(r'<span id="xrange"[^>]*data-window-s="(\d+)"[^>]*>([^<]*)<', page)
        assert xrange and int(xrange[1]) == w, page[:2000]
        ranges[w] = xrange[2]
        canvases = re.findall(r'<canvas id="\w+"[^>]*data-x-range="(\d+) s"', page)
        assert canvases == [str(w), str(w)], canvases
    assert ranges[60].startswith("last 1 m: ") and ranges[600].startswith("last 10 m: ")
    assert ranges[3600].startswith("last 1 h: ") and len(set(ranges.values())) == 3
    # evictions: consecutive removals from one tier are one row with their count
    removals = dom.split('id="removals"')[1].split("</table>")[0]
    events = int(re.search(r'data-events="(\d+)"', removals)[1])  # type: ignore[index]
    counts = [int(n) for n in re.findall(r'<tr data-events="(\d+)"', removals)]
    assert len(counts) == int(points["removals"]) and sum(counts) == events
    assert max(counts) > 1 and len(counts) < events, counts
    # namespace ids whole: the cell's text and its title (a label column beside them)
    for ns in (namespace("alpha"), namespace("beta")):
        assert f'<code class="nsid" title="{ns.id.hex()}">{ns.id.hex()}</code>' in dom
    assert "<th>label</th>" in dom
    assert '<td class="label">test · tenant alpha</td>' in dom, dom[-3000:]
    assert '<td class="label muted">—</td>' in dom  # beta: no label, and never an empty cell
    # the chart's styles: tier input solid, copies dashed (write_back into disk)
    legend = dom.split('id="bandwidth-legend"')[1].split("</div>")[0]
    assert 'data-style="solid"' in legend and 'data-style="dashed"' in legend, legend
    assert re.search(r'Lookup hit rate, last 10 m: <strong>\d', dom), dom[-3000:]
    for run in (opened, minute, hour, shown):  # everything the page does, its policy allows
        violations = [ln for ln in run.stderr.splitlines() if "Content Security Policy" in ln]
        assert violations == [], violations[:5]
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
