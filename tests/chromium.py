"""Headless Chromium for the tests that look at a page as a person would: open it, run a script in it, take a
screenshot. Driven over the DevTools protocol with aiohttp's websocket client, so no browser package (and no
browser download) is needed: Debian's chromium is enough (`apt-get install chromium`; `.ci/run` installs it).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests import tiers

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = "headless Chromium is not installed (apt-get install chromium)"
# What this machine's closed network needs (nothing reaching out), and clips that play without a click.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
)


class Page:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result; events that arrive meanwhile are skipped."""
        call = next(self._ids)
        await self.socket.send_json({"id": call, "method": method, "params": params})
        while True:
            message = json.loads((await self.socket.receive(timeout=60)).data)
            if message.get("id") == call:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def open(self, url: str, width: int = 1200, height: int = 900) -> None:
        size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await self.send("Emulation.setDeviceMetricsOverride", **size)
        await self.send("Page.navigate", url=url)
        for _ in range(300):
            if await self.evaluate("document.readyState") == "complete":
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{url} did not finish loading")

    async def evaluate(self, expression: str) -> Any:
        """The value of a script (a promise is awaited)."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        return base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])


@asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium with a fresh profile in ``profile``, and its one tab."""
    assert CHROMIUM is not None, MISSING
    tiers.starting("Chromium")
    process = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it chose here
        for _ in range(300):
            if port_file.is_file() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            targets = await (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            tab = next(target for target in targets if target["type"] == "page")
            async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                yield Page(socket)
    finally:
        process.kill()
        process.wait()
