"""Test glue for the web view: `agentcas ui` started as a user would, and raw HTTP requests to it.

`UiServer` runs the real command in a subprocess (--no-browser, port 0), reads the URL it
prints first, and stops it with a signal, returning its exit code. `request` speaks HTTP
through http.client so a test controls the method, the raw path and the Host header.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
from urllib.parse import parse_qs, urlsplit

from support.cli import AGENTCAS


class UiServer:
    def __init__(self, store, env: dict | None = None, args=()):
        argv = [AGENTCAS] + (["--store", str(store)] if store is not None else []) + ["ui", "--no-browser", *args]
        full_env = dict(os.environ, **(env or {}))
        full_env.pop("AGENTCAS_DEBUG", None)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            self.proc.wait(timeout=30)
            raise AssertionError(f"agentcas ui printed no URL (exit {self.proc.returncode}): "
                                 f"{self.proc.stderr.read()}")
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname, parts.port
        self.token = parse_qs(parts.query)["token"][0]
        self.base = f"http://{parts.netloc}"

    def request(self, path: str, method: str = "GET", token: bool = True, headers: dict | None = None,
                host: str | None = None):
        """(status, headers, body text) of one request; `token` adds ?token= to the path."""
        if token:
            path += ("&" if "?" in path else "?") + "token=" + self.token
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", host if host is not None else f"{self.host}:{self.port}")
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            conn.endheaders()
            response = conn.getresponse()
            body = response.read().decode("utf-8")
            return response.status, response.headers, body
        finally:
            conn.close()

    def get(self, path: str, **kw) -> str:
        status, _, body = self.request(path, **kw)
        assert status == 200, (path, status, body[:500])
        return body

    def api(self, path: str) -> dict:
        return json.loads(self.get("/api/" + path))

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode


def wait_closed(port: int, host: str = "127.0.0.1", seconds: float = 10) -> bool:
    """Whether nothing listens on host:port any more (within `seconds`)."""
    import socket
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) != 0:
                return True
        time.sleep(0.05)
    return False
