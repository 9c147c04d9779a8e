"""Open every page of the built site in headless Chromium; fail on a console error, an uncaught
exception, a resource that fails to load, or an internal link or anchor that does not resolve.

``mkdocs build --strict`` checks the Markdown's links; this checks what a reader's browser gets:
the theme's scripts and assets, and the links in the rendered HTML (the navigation included).

Usage: ``python docs/check_site.py SITE_DIR`` (``make docs-check``). Needs Chromium (Debian:
``apt-get install chromium``) and ``websockets`` (the dev extra has it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

from websockets.sync.client import connect

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
SETTLE_S = 0.5  # after the load event, for scripts that log late (search index, clipboard)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir)")
    args = parser.parse_args(argv)
    problems = check_site(args.site)
    for problem in problems:
        print(problem, file=sys.stderr)
    pages = len(list(args.site.rglob("*.html")))
    print(f"{len(problems)} problems on {pages} pages of {args.site}")
    return 1 if problems else 0


def check_site(site: Path) -> list[str]:
    """Every problem found on the site's pages, one line each (none: all is well)."""
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    problems: list[str] = []
    with _serve(site) as base, _browser() as browser:
        for page in pages:
            url = urljoin(base, page)
            errors, links = browser.open(url)
            problems += [f"{page}: {e}" for e in errors]
            problems += [f"{page}: {e}" for e in _broken(links, base)]
    return problems


def _broken(links: list[str], base: str) -> list[str]:
    """The internal links among ``links`` whose page or anchor does not exist."""
    broken = []
    for link in links:
        if not link.startswith(base):
            continue  # an outside site: not ours to check offline
        target, anchor = urldefrag(link)
        ids = _ids(target)
        if ids is None:
            broken.append(f"broken link {link}")
        elif anchor and anchor not in ids:
            broken.append(f"link to a missing anchor {link}")
    return broken


@functools.cache
def _ids(url: str) -> frozenset[str] | None:
    """The element ids of the page at ``url``; None where it does not load."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.URLError:
        return None
    return frozenset(re.findall(r'\bid="([^"]+)"', text))


@contextlib.contextmanager
def _serve(site: Path) -> Iterator[str]:
    """The site over HTTP on a free loopback port (file:// URLs would block its scripts)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Page:
    """One browser tab driven over the Chrome DevTools Protocol."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._next_id = 0
        for domain in ("Page", "Runtime", "Log"):
            self._call(f"{domain}.enable")

    def open(self, url: str) -> tuple[list[str], list[str]]:
        """Load ``url``; return the errors it logged and the absolute URLs of its links."""
        events: list[dict[str, Any]] = []
        self._call("Page.navigate", {"url": url}, events)
        self._wait_for("Page.loadEventFired", events)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                events.append(json.loads(self._ws.recv(timeout=deadline - time.monotonic())))
        script = "JSON.stringify(Array.from(document.querySelectorAll('a[href]'), a => a.href))"
        result = self._call("Runtime.evaluate", {"expression": script, "returnByValue": True})
        links = json.loads(result["result"]["value"])
        return [e for e in map(_error, events) if e], links

    def _call(
        self, method: str, params: dict | None = None, events: list | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if events is not None:
                events.append(message)

    def _wait_for(self, method: str, events: list[dict[str, Any]]) -> None:
        while not any(e.get("method") == method for e in events):
            events.append(json.loads(self._ws.recv(timeout=30)))


def _error(event: dict[str, Any]) -> str | None:
    """The event as an error line, or None where it is not one."""
    params = event.get("params", {})
    if event.get("method") == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"uncaught: {details.get('exception', {}).get('description') or details['text']}"
    if event.get("method") == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        return "console error: " + " ".join(str(a.get("value", a)) for a in params["args"])
    if event.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"{entry['source']} error: {entry['text']} {entry.get('url', '')}".strip()
    return None


@contextlib.contextmanager
def _browser() -> Iterator[_Page]:
    """Headless Chromium with one tab, closed on the way out."""
    binary = next(filter(None, map(shutil.which, BROWSERS)), None)
    if binary is None:
        raise SystemExit(f"no Chromium found ({', '.join(BROWSERS)}); apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        command = [
            binary,
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace to sandbox with
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        try:
            port = _devtools_port(process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
                tab = next(t for t in json.load(response) if t["type"] == "page")
            with connect(tab["webSocketDebuggerUrl"], max_size=None) as ws:
                yield _Page(ws)
        finally:
            process.terminate()
            process.wait(timeout=10)


def _devtools_port(process: subprocess.Popen) -> int:
    """The port Chromium says it listens on (``DevTools listening on ws://127.0.0.1:PORT/...``)."""
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if match:  # drain the rest, so that a chatty browser never blocks on a full pipe
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return int(match.group(1))
    raise RuntimeError(f"Chromium exited ({process.wait()}) without opening DevTools")


if __name__ == "__main__":
    sys.exit(main())
