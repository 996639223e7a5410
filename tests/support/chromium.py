"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
commands on the browser's fd 3, replies and events on its fd 4, each message JSON ending in a
NUL byte), with the standard library only: load a page, collect its console errors, failed
loads and uncaught exceptions, evaluate JavaScript in it, take a screenshot."""
from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """$PARAVT_CHROMIUM (if it names an executable), else the first Chromium on PATH (None: no
    browser installed)."""
    explicit = os.environ.get("PARAVT_CHROMIUM")
    if explicit:
        return shutil.which(explicit)
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Chromium:
    def __init__(self, executable: str, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="paravt-chromium-")
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()

        # the pipe ends on the browser's fds 3 and 4, placed by bash (dash reads one-digit fds
        # only; a preexec_fn would make subprocess fork a multithreaded JAX process)
        args = [executable, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--allow-file-access-from-files", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        shell = f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self.process = subprocess.Popen(["bash", "-c", shell, *args], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        pass_fds=(to_browser_read, from_browser_write))
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._id = 0
        self._replies: dict[int, dict] = {}
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def _read_loop(self):
        buffer = b""
        while True:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        self._replies[message["id"]] = message
                        self._lock.notify_all()
                else:
                    self._events.put(message)
        with self._lock:
            self._lock.notify_all()

    def call(self, method: str, **params) -> dict:
        self._id += 1
        number = self._id
        message = {"id": number, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while number not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise BrowserError(f"{method}: no reply from Chromium (exit status {self.process.poll()})")
                self._lock.wait(min(left, 0.5))
            reply = self._replies.pop(number)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def load(self, url: str) -> list[str]:
        """Navigates to `url`, waits for its load event; returns the page's errors: console
        errors, failed resource loads (Log entries of level error) and uncaught exceptions."""
        errors = []
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        loaded = False
        while not loaded or not self._events.empty():
            try:
                event = self._events.get(timeout=max(0.05, deadline - time.monotonic()) if not loaded else 0.5)
            except queue.Empty:
                if loaded:
                    break
                raise BrowserError(f"{url}: no load event within {self.timeout:g} s") from None
            method, params = event.get("method"), event.get("params", {})
            if method == "Page.loadEventFired":
                loaded = True
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                values = (str(a.get("value", a.get("description", ""))) for a in params["args"])
                errors.append("console: " + " ".join(values))
            elif method == "Runtime.exceptionThrown":
                errors.append("exception: " + params["exceptionDetails"].get("text", ""))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return errors

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, path: str, max_height: int = 6000) -> str:
        """A PNG of the whole page (at most `max_height` pixels tall)."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        width, height = int(size["width"]), min(int(size["height"]), max_height)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self):
        try:
            self.session = None
            self.call("Browser.close")
        except BrowserError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        self._reader.join(timeout=5)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
