"""Time ``probe view`` on a run: start-up, the run page, trial pages, one trial (docs/view.md, "Speed").

    python -m scripts.view_bench RUN [--cold]

Starts ``probe view RUN`` as its own process on a free port, waits for its
URL, then times each request (wall time of the whole answer, read to the end,
best and first of 3) with the standard library's HTTP client. ``--cold``
builds the trial index in an empty cache first (``PROBE_CACHE`` set to a temp
folder), as the first ``probe view`` of a run does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def fetch(port: int, path: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return time.perf_counter() - t0, resp.status, len(body)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--cold", action="store_true", help="build the trial index in an empty cache")
    a = p.parse_args()
    env = dict(os.environ)
    if a.cold:
        env["PROBE_CACHE"] = tempfile.mkdtemp(prefix="probe-view-bench-")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe", "view", a.run],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    port = None
    for line in proc.stdout:
        print(line.rstrip())
        if m := re.search(r"http://127\.0\.0\.1:(\d+)/", line):
            port = int(m.group(1))
            break
    if port is None:
        print("probe view did not print its URL", file=sys.stderr)
        return 1
    print(
        f"start-up (index {'built' if a.cold else 'from the cache'}, chunks verified): {time.perf_counter() - t0:.2f} s"
    )
    rows = json.loads(fetch_body(port, "/api/r/0/trials?limit=1&offset=300000"))["rows"]
    rows = rows or json.loads(fetch_body(port, "/api/r/0/trials?limit=1"))["rows"]
    trial_id = rows[0]["trial_id"]
    cases = [
        ("run page (manifest, integrity, report summary)", "/r/0/"),
        ("trial browser, first page (50 of all trials)", "/r/0/trials"),
        ("trial browser, a page deep in the run", "/r/0/trials?offset=300000"),
        ("filtered page: one item, one instrument", "/r/0/trials?item=pond_child&instrument=binary&offset=100"),
        ("filtered page: greedy option Yes", "/r/0/trials?option=Yes"),
        ("filtered page: coverage below 0.99", "/r/0/trials?coverage_below=0.99"),
        ("filtered page: a reply's parse status ok", "/r/0/trials?status=ok"),
        ("filtered page: greedy differs from the sampled majority", "/r/0/trials?disagree=1"),
        ("one trial (prompt, options, replies, verdicts)", f"/r/0/trial/{trial_id}"),
        ("one trial as JSON", f"/api/r/0/trial/{trial_id}"),
    ]
    print(f"\n{'request':<58} {'first':>8} {'best of 3':>10} {'bytes':>9}  status")
    for label, path in cases:
        times = []
        for _ in range(3):
            sec, status, size = fetch(port, path)
            times.append(sec)
        print(f"{label:<58} {times[0] * 1000:7.0f}ms {min(times) * 1000:9.0f}ms {size:9,d}  {status}")
    proc.terminate()
    proc.wait(timeout=30)
    return 0


def fetch_body(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path)
    return conn.getresponse().read()


if __name__ == "__main__":
    sys.exit(main())
