"""The web view's HTTP server: the standard library's ThreadingHTTPServer behind four checks.

Every request passes, in this order:
  1. Host: the Host header must name the address served (`127.0.0.1:PORT`, and `localhost:PORT`
     on a loopback address), so a page on another site whose name was rebound to 127.0.0.1
     (DNS rebinding) is refused (403) even from the user's own browser;
  2. token: `?token=T` or the cookie it sets (HttpOnly, SameSite=Strict, one name per port);
     none is 401, a wrong one 403; compared in constant time (hmac.compare_digest);
  3. method: GET and HEAD only, anything else 405;
  4. path: only the routes below; a `.`/`..` segment or an undecodable name is 400 (nothing is
     ever read from the file system by path: the templates are fixed files).
Responses carry a Content-Security-Policy without scripts (the pages have none), no-store,
nosniff, no referrer (the token may be in the URL) and no framing. Requests are served in
threads (a browser keeps idle connections open) but read the store one at a time (a lock).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import signal
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from agentcas.errors import AgentcasError, NotFound, UsageError
from agentcas.ui import documents, pages
from agentcas.ui.documents import PageRequest
from agentcas.ui.reads import StoreReads

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class ListenFailed(AgentcasError):
    """The address or port cannot be listened on."""


class ViewServer(ThreadingHTTPServer):
    """The HTTP server with what every request is checked against: token, allowed Host values."""

    daemon_threads = True

    def __init__(self, store, host: str, port: int):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), ViewHandler)
        self.reads = StoreReads(store)
        self.store_lock = threading.Lock()
        self.token = secrets.token_urlsafe(32)
        self.host = host
        self.port = self.server_address[1]
        self.cookie_name = f"agentcas_ui_{self.port}"
        self.allowed_hosts = allowed_hosts(host, self.port)

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/?token={self.token}"


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host header values naming this server; None for a wildcard bind (any IP literal)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:   # a name given with --host: that name only
        return frozenset({f"{host.lower()}:{port}"})
    if address.is_unspecified:
        return None
    names = {f"[{host}]:{port}" if address.version == 6 else f"{host}:{port}"}
    if address.is_loopback:
        names.add(f"localhost:{port}")
    return frozenset(names)


def _host_allowed(server: ViewServer, header: str | None) -> bool:
    if not header:
        return False
    value = header.strip().lower()
    if server.allowed_hosts is not None:
        return value in server.allowed_hosts
    # A wildcard bind: an IP literal with our port (a rebound *name* is still refused).
    literal, _, port = value.rpartition(":")
    try:
        ipaddress.ip_address(literal.strip("[]"))
    except ValueError:
        return False
    return port == str(server.port)


class ViewHandler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "agentcas-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):   # noqa: A002 - the base class's name
        """No access log: the token is in URLs, and nobody may be reading our stderr."""

    # Every method not GET/HEAD reaches here (BaseHTTPRequestHandler looks up do_<METHOD>).
    def __getattr__(self, name: str):
        if name.startswith("do_"):
            return self._other_method
        raise AttributeError(name)

    def do_GET(self):
        self._respond()

    def do_HEAD(self):   # the GET answer's headers; _send leaves the body out
        self._respond()

    def _other_method(self):
        if self._admitted():
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                       b"only GET and HEAD: this view is read-only\n", extra={"Allow": "GET, HEAD"})

    # -- the checks --------------------------------------------------------------------------
    def _admitted(self, query: dict | None = None) -> bool:
        """Host and token checks; on failure the refusal is sent and False returned."""
        if not _host_allowed(self.server, self.headers.get("Host")):
            self._send(HTTPStatus.FORBIDDEN, "text/plain; charset=utf-8",
                       b"refused: the Host header does not name this server\n")
            return False
        if query is None:
            query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        given = query.get("token", [None])[-1]
        self._set_cookie = False
        if given is None:
            given = self._cookie_token()
        else:
            self._set_cookie = True
        if given is None:
            self._send(HTTPStatus.UNAUTHORIZED, "text/plain; charset=utf-8",
                       b"a token is needed: open the URL that `agentcas ui` printed\n")
            return False
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.server.token.encode()):
            self._set_cookie = False
            self._send(HTTPStatus.FORBIDDEN, "text/plain; charset=utf-8", b"wrong token\n")
            return False
        return True

    def _cookie_token(self) -> str | None:
        from http.cookies import CookieError, SimpleCookie
        cookies = SimpleCookie()
        try:
            for header in self.headers.get_all("Cookie") or []:
                cookies.load(header)
        except CookieError:
            return None
        morsel = cookies.get(self.server.cookie_name)
        return None if morsel is None else morsel.value

    # -- routing ------------------------------------------------------------------------------
    def _respond(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        if not self._admitted(query):
            return
        api = parts.path.startswith("/api/")
        try:
            status, content_type, body = self._route(parts.path, {k: v[-1] for k, v in query.items()})
        except (NotFound, FileNotFoundError) as exc:
            status, content_type, body = self._error(HTTPStatus.NOT_FOUND, str(exc), api)
        except UsageError as exc:
            status, content_type, body = self._error(HTTPStatus.BAD_REQUEST, str(exc), api)
        except AgentcasError as exc:
            status, content_type, body = self._error(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), api)
        except Exception as exc:  # noqa: BLE001 - a page must answer; one line on stderr
            print(f"agentcas: error: ui: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            status, content_type, body = self._error(HTTPStatus.INTERNAL_SERVER_ERROR,
                                                     f"internal error: {type(exc).__name__}", api)
        self._send(status, content_type, body)

    def _route(self, path: str, query: dict) -> tuple[int, str, bytes]:
        try:
            decoded = [unquote(s, errors="strict") for s in path.split("/")]
        except UnicodeDecodeError:
            raise UsageError("the path is not UTF-8 once decoded") from None
        if any(s in (".", "..") for s in decoded) or any("\x00" in s for s in decoded):
            raise UsageError("path traversal refused: a path segment is '.' or '..'")
        api = path.startswith("/api/")
        rest = path[len("/api"):] if api else path
        kind, _, tail = rest.lstrip("/").partition("/")
        name = unquote(tail, errors="strict")
        reads, lock = self.server.reads, self.server.store_lock
        with lock:
            if api:
                doc = self._api(kind, name, tail, query)
                return HTTPStatus.OK, "application/json", (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
            if rest == "/":
                html = pages.lineage_page(reads, query.get("root") or None, query.get("after") or None)
            elif kind == "thread" and tail:
                html = pages.thread_page(reads, name, query.get("cursor"), query.get("limit"), query.get("effects"))
            elif kind == "checkpoint" and tail:
                html = pages.checkpoint_page(reads, name, query.get("files"), query.get("against") or None,
                                             query.get("diff"))
            elif rest == "/diff":
                if not query.get("from") or not query.get("to"):
                    raise UsageError("diff needs from= and to=")
                html = pages.checkpoint_page(reads, query["to"], None, query["from"], query.get("diff"))
            else:
                raise NotFound(f"no page at {path}")
        return HTTPStatus.OK, "text/html; charset=utf-8", html.encode("utf-8")

    def _api(self, kind: str, name: str, tail: str, query: dict) -> dict:
        reads = self.server.reads
        page = PageRequest.parse(query.get("cursor"), query.get("limit"))
        if kind == "threads" and not tail:
            return documents.threads_page(reads, page)
        if kind == "thread" and tail:
            return documents.thread_page(reads, name, page)
        if kind == "checkpoint" and tail:
            return documents.checkpoint_page(reads, name, page)
        if kind == "diff" and not tail:
            return documents.diff_page(reads, query.get("from"), query.get("to"), page)
        raise NotFound(f"no API document at /api/{kind}")

    def _error(self, status: int, message: str, api: bool) -> tuple[int, str, bytes]:
        if api:
            return status, "application/json", (json.dumps({"error": message, "status": int(status)}) + "\n").encode()
        return status, "text/html; charset=utf-8", pages.error_page(int(status), message).encode("utf-8")

    def _send(self, status: int, content_type: str, body: bytes, extra: dict | None = None) -> None:
        self.send_response(status)
        headers = dict(SECURITY_HEADERS, **{"Content-Type": content_type, "Content-Length": str(len(body))})
        headers.update(extra or {})
        for key, value in headers.items():
            self.send_header(key, value)
        if getattr(self, "_set_cookie", False) and status < 400:
            self.send_header("Set-Cookie", f"{self.server.cookie_name}={self.server.token}; HttpOnly; "
                                           "SameSite=Strict; Path=/")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def serve(store, host: str, port: int, open_browser: bool, announce) -> None:
    """Serve the view of `store` until SIGINT or SIGTERM; `announce(url)` first (the URL with its token)."""
    try:
        server = ViewServer(store, host, port)
    except OSError as exc:
        raise ListenFailed(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    worker = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    worker.start()
    try:
        announce(server.url)
        if open_browser:
            import webbrowser
            threading.Thread(target=webbrowser.open, args=(server.url,), daemon=True).start()
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
