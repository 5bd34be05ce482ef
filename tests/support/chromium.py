"""A real headless Chromium driven over the DevTools protocol (a websocket, aiohttp's client): open a page, evaluate
JavaScript in it, take a screenshot. No browser-automation dependency: the protocol's few calls a test needs.

The binary is Debian's ``chromium`` (``make test`` installs it when missing), else ``chromium-browser``,
``google-chrome`` or ``$CHROMIUM``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp


def chromium_binary() -> str:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise RuntimeError(
        "no Chromium: install Debian's chromium (apt-get install chromium; make test does it as root) or set $CHROMIUM"
    )


class Chromium:
    """``async with Chromium() as browser: await browser.open(url); await browser.evaluate("1 + 1")``."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="cognitora-chromium-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self.console: list[str] = []  # the page's console messages and uncaught exceptions

    async def __aenter__(self) -> Chromium:
        argv = [
            chromium_binary(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Chromium writes the port it picked (and the browser's websocket path) to DevToolsActivePort.
        active = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and len(active.read_text().split()) >= 2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                await self.__aexit__(None, None, None)
                raise RuntimeError("chromium did not start (no DevToolsActivePort)")
            await asyncio.sleep(0.05)
        port = int(active.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        targets: list[dict[str, Any]] = []
        while not any(t.get("type") == "page" for t in targets):
            async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            if time.monotonic() > deadline:
                raise RuntimeError(f"chromium shows no page target: {targets}")
            await asyncio.sleep(0.05)
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 * 2**20)
        await self.call("Runtime.enable")
        await self.call("Page.enable")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30) -> dict[str, Any]:
        """One protocol command; events that arrive meanwhile are kept only as console lines."""
        assert self._ws is not None
        ident = next(self._ids)
        await self._ws.send_json({"id": ident, "method": method, "params": params or {}})
        async with asyncio.timeout(timeout_s):
            while True:
                msg = await self._ws.receive_json()
                if msg.get("id") == ident:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    result: dict[str, Any] = msg.get("result", {})
                    return result
                self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"console.{params.get('type')}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.console.append(f"exception: {details.get('exception', {}).get('description', details.get('text'))}")

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", {"url": url})

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values; promises awaited)."""
        result = await self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (its full height, at the window's width)."""
        height = await self.evaluate("document.documentElement.scrollHeight")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": max(int(height), self.height), "deviceScaleFactor": 1, "mobile": False},
        )
        shot = await self.call("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))
