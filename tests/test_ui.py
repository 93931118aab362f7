"""`agentcas ui` over HTTP: the real command in a subprocess, spoken to with http.client.

What is checked: the URL on the first line and a clean exit on SIGTERM/SIGINT; the token
(401 without, 403 wrong, the cookie it sets); the Host check; GET/HEAD only; escaping of a
hostile thread name, file path, reason and record text; path traversal; paging and folding;
JSON documents equal to the CLI's --json; the shared store (S3 + PostgreSQL).
"""

from __future__ import annotations

import html
import json
import re
import signal

import pytest
from markupsafe import escape

from agentcas import Store

from support.cli import run_cli
from support.harness_samples import ClaudeSession
from support.store_state import store_rows
from support.ui_server import UiServer, wait_closed

HOSTILE_THREAD = "<script>alert(1)</script>"
HOSTILE_PATH = "<img src=x onerror=alert(2)>.txt"
HOSTILE_REASON = "<script>alert(3)</script> & \"quoted\""
HOSTILE_RECORD = "<script>alert(4)</script><b>bold</b>"


def write(root, files: dict):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data)
    return root


@pytest.fixture
def small_store(store_dir, tmp_path):
    """main (2 checkpoints), a fork `alt` with one more, a hostile thread name, file and reason."""
    ws = write(tmp_path / "ws", {"notes.md": "one\n", HOSTILE_PATH: "x\n"})
    rollout = tmp_path / "r.jsonl"
    rollout.write_text('{"role":"user","text":"hi"}\n')
    store = Store.open(str(store_dir))
    first = store.checkpoints.commit(str(ws), HOSTILE_REASON, "main", str(rollout))
    write(ws, {"notes.md": "two\n", "new.txt": "n\n"})
    rollout.write_text('{"role":"user","text":"hi"}\n{"role":"assistant","text":"hello"}\n')
    second = store.checkpoints.commit(str(ws), "second", "main", str(rollout))
    store.threads.fork("main", "alt")
    store.threads.fork("main", HOSTILE_THREAD, 1)
    write(ws, {"alt.txt": "a\n"})
    third = store.checkpoints.commit(str(ws), "on alt", "alt")
    store.effects.add("alt", "pending", "http.request", "https://example.test/<i>", "irreversible")
    store.close()
    return {"dir": store_dir, "first": first.checkpoint, "second": second.checkpoint,
            "third": third.checkpoint}


@pytest.fixture
def ui(small_store):
    server = UiServer(small_store["dir"])
    yield server
    server.stop()


# --- the command --------------------------------------------------------------------------------

def test_first_line_is_the_url_with_a_token_and_sigterm_exits_0(small_store):
    server = UiServer(small_store["dir"])
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{30,}", server.url)
    assert server.port > 0
    assert server.request("/")[0] == 200
    assert server.stop(signal.SIGTERM) == 0
    assert wait_closed(server.port)


def test_sigint_exits_0(small_store):
    server = UiServer(small_store["dir"])
    assert server.request("/")[0] == 200
    assert server.stop(signal.SIGINT) == 0


def test_each_run_has_its_own_token(small_store):
    one, two = UiServer(small_store["dir"]), UiServer(small_store["dir"])
    try:
        assert one.token != two.token and one.port != two.port
        assert one.request("/?token=" + two.token, token=False)[0] == 403
    finally:
        one.stop(), two.stop()


def test_a_port_in_use_is_one_clear_error(small_store):
    server = UiServer(small_store["dir"])
    try:
        r = run_cli("ui", "--no-browser", "--port", server.port, store=small_store["dir"])
        assert r.code == 1 and r.err.startswith("agentcas: error: cannot listen on 127.0.0.1:") and r.out == ""
        assert "Traceback" not in r.err
    finally:
        server.stop()


def test_a_bad_port_is_a_usage_error(small_store):
    r = run_cli("ui", "--no-browser", "--port", "70000", store=small_store["dir"])
    assert r.code == 2 and r.out == ""


def test_no_store_is_an_error_before_listening(tmp_path):
    r = run_cli("ui", "--no-browser", store=tmp_path / "missing")
    assert r.code == 1 and r.out == "" and r.err.startswith("agentcas: error:")


# --- token, Host, methods -----------------------------------------------------------------------

def test_without_a_token_401_with_a_wrong_one_403(ui):
    for path in ("/", "/api/threads", "/thread/main", "/nope"):
        status, _, body = ui.request(path, token=False)
        assert status == 401, path
        assert "alert" not in body
    assert ui.request("/?token=wrong", token=False)[0] == 403
    assert ui.request("/?token=" + ui.token[:-1], token=False)[0] == 403
    assert ui.request("/?token=", token=False)[0] == 403
    assert ui.request("/", token=False, headers={"Cookie": f"agentcas_ui_{ui.port}=wrong"})[0] == 403


def test_the_query_token_sets_a_strict_httponly_cookie_that_then_suffices(ui):
    status, headers, _ = ui.request("/")
    assert status == 200
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"agentcas_ui_{ui.port}={ui.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    status, headers, body = ui.request("/api/threads", token=False,
                                       headers={"Cookie": f"other=1; agentcas_ui_{ui.port}={ui.token}"})
    assert status == 200 and json.loads(body)["threads"]
    assert "Set-Cookie" not in headers   # only when a token came in the query
    # A cookie for another port's view is not this one's.
    assert ui.request("/", token=False, headers={"Cookie": f"agentcas_ui_1={ui.token}"})[0] == 401


def test_a_host_header_naming_another_server_is_refused(ui):
    for host in (f"evil.example:{ui.port}", "evil.example", f"127.0.0.1:{ui.port + 1}", f"127.0.0.1.evil:{ui.port}", ""):
        status, _, body = ui.request("/", host=host)
        assert status == 403, host
        assert "main" not in body
    assert ui.request("/", host=f"localhost:{ui.port}")[0] == 200
    assert ui.request("/", host=f"127.0.0.1:{ui.port}")[0] == 200


def test_only_get_and_head(ui, small_store):
    before = store_rows(small_store["dir"])
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"):
        status, headers, _ = ui.request("/thread/main", method=method)
        assert status == 405, method
        assert headers["Allow"] == "GET, HEAD"
    status, headers, body = ui.request("/thread/main", method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 0
    assert store_rows(small_store["dir"]) == before


def test_responses_forbid_scripts_framing_caching_and_referrers(ui):
    _, headers, _ = ui.request("/")
    assert "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["X-Frame-Options"] == "DENY" and headers["Cache-Control"] == "no-store"
    assert headers["Referrer-Policy"] == "no-referrer" and headers["X-Content-Type-Options"] == "nosniff"


# --- escaping and traversal ---------------------------------------------------------------------

def esc(text: str) -> str:
    """`text` as the pages' templates write it (Jinja2's autoescape)."""
    return str(escape(text))


def assert_no_markup_from_the_store(body: str) -> None:
    assert "<script" not in body.lower()
    assert "<img" not in body.lower()
    assert "<b>" not in body and "<i>" not in body


def test_a_hostile_thread_name_is_text_everywhere(ui):
    lineage = ui.get("/")
    assert_no_markup_from_the_store(lineage)
    assert f'data-thread="{esc(HOSTILE_THREAD)}"' in lineage
    assert f'data-child="{esc(HOSTILE_THREAD)}"' in lineage
    page = ui.get("/thread/%3Cscript%3Ealert%281%29%3C/script%3E")
    assert_no_markup_from_the_store(page)
    assert esc(HOSTILE_THREAD) in page
    assert ui.api("thread/%3Cscript%3Ealert%281%29%3C/script%3E")["thread"] == HOSTILE_THREAD


def test_a_hostile_file_path_and_reason_are_text(ui, small_store):
    page = ui.get(f"/checkpoint/{small_store['first']}")
    assert_no_markup_from_the_store(page)
    assert esc(HOSTILE_PATH) in page and esc(HOSTILE_REASON) in page
    thread = ui.get("/thread/main")
    assert_no_markup_from_the_store(thread)
    assert esc(HOSTILE_REASON) in thread
    diff = ui.get(f"/checkpoint/{small_store['first']}?against={small_store['third']}")
    assert_no_markup_from_the_store(diff)
    assert esc(HOSTILE_PATH) not in diff or 'data-diff' in diff
    # The effect's target (https://example.test/<i>) on the thread page.
    alt = ui.get("/thread/alt")
    assert_no_markup_from_the_store(alt)
    assert esc("https://example.test/<i>") in alt


def test_control_and_bidi_characters_are_shown_as_escapes(store_dir, tmp_path):
    ws = write(tmp_path / "ws", {"a\u202eb.txt": "x\n"})
    store = Store.open(str(store_dir))
    digest = store.checkpoints.commit(str(ws), "reason \u202e reversed", "main").checkpoint
    store.close()
    server = UiServer(store_dir)
    try:
        page = server.get(f"/checkpoint/{digest}")
        assert "\u202e" not in page
        assert "a\\u202eb.txt" in page and "reason \\u202e reversed" in page
    finally:
        server.stop()


def test_record_text_in_a_replay_is_text(store_dir, tmp_path):
    session = ClaudeSession()
    session.prompt(HOSTILE_RECORD)
    session.say("I will not run " + HOSTILE_RECORD)
    path = tmp_path / "projects" / "-home-u-proj" / f"{session.session_id}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(session.data())
    assert run_cli("ingest", "claude", tmp_path / "projects", store=store_dir).code == 0
    thread = f"claude/{session.session_id}"
    server = UiServer(store_dir)
    try:
        head = server.api(f"thread/{thread}")["checkpoints"][0]["checkpoint"]
        page = server.get(f"/checkpoint/{head}")
        assert "what the model saw" in page
        assert_no_markup_from_the_store(page)
        assert esc(HOSTILE_RECORD) in page
        # The replay shown is the one `agentcas replay` prints.
        text = run_cli("replay", head, store=store_dir).out
        assert esc(text.splitlines()[1].strip()) in page
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/../../../../etc/passwd", "/thread/../../../etc/passwd",
                                  "/thread/..%2F..%2F..%2Fetc%2Fpasswd", "/checkpoint/..%2F..%2Fetc%2Fpasswd",
                                  "/api/thread/..%2F..%2Fetc%2Fpasswd", "/%2e%2e/%2e%2e/etc/passwd",
                                  "/api/../../etc/passwd", "/thread/%00", "/thread/%ff%fe"])
def test_path_traversal_is_refused(ui, path):
    status, _, body = ui.request(path)
    assert status in (400, 404), (path, status)
    assert "root:" not in body


def test_unknown_pages_and_objects_are_404(ui):
    assert ui.request("/nope")[0] == 404
    assert ui.request("/thread/nope")[0] == 404
    assert ui.request("/checkpoint/" + "0" * 64)[0] == 404
    status, _, body = ui.request("/api/thread/nope")
    assert status == 404 and json.loads(body) == {"error": "no thread named 'nope'", "status": 404}


# --- JSON documents: the CLI's --json, paged ----------------------------------------------------

def without_cursor(doc: dict) -> dict:
    assert "next_cursor" in doc
    return {k: v for k, v in doc.items() if k != "next_cursor"}


def test_api_documents_equal_the_clis_json(ui, small_store):
    store = small_store["dir"]

    def cli(*args):
        r = run_cli("--json", *args, store=store)
        assert r.code == 0, r
        return r.json()

    assert without_cursor(ui.api("threads")) == cli("branch")
    assert without_cursor(ui.api("thread/main")) == cli("log", "main")
    assert without_cursor(ui.api("thread/alt")) == cli("log", "alt")
    assert without_cursor(ui.api(f"checkpoint/{small_store['first']}")) == cli("show", small_store["first"], "--files")
    assert without_cursor(ui.api("checkpoint/alt")) == cli("show", "alt", "--files")
    first, third = small_store["first"], small_store["third"]
    assert without_cursor(ui.api(f"diff?from={first}&to={third}")) == cli("diff", first, third)
    assert without_cursor(ui.api("diff?from=alt&to=main")) == cli("diff", "alt", "main")


def test_api_bad_parameters_are_400(ui):
    for path in ("/api/threads?limit=0", "/api/threads?limit=201", "/api/threads?limit=x",
                 "/api/thread/main?cursor=zz", "/api/checkpoint/main?cursor=-1", "/api/diff?from=main",
                 "/api/thread/bad..name"):
        status, _, body = ui.request(path)
        assert status == 400, path
        assert json.loads(body)["status"] == 400


@pytest.fixture
def long_thread(store_dir, tmp_path):
    """main with 230 checkpoints and 205 files; 260 forks of main."""
    ws = tmp_path / "ws"
    write(ws, {f"f/{n:03d}.txt": str(n) for n in range(205)})
    store = Store.open(str(store_dir))
    for n in range(230):
        (ws / "step").write_text(str(n))
        store.checkpoints.commit(str(ws), f"step {n}", "main")
    for n in range(260):
        store.threads.fork("main", f"fork-{n:03d}")
    store.close()
    return store_dir


def test_thread_pages_hold_at_most_200_checkpoints_and_the_cursor_walks_them_all(long_thread):
    server = UiServer(long_thread)
    try:
        log = run_cli("--json", "log", "main", store=long_thread).json()["checkpoints"]
        seen, cursor, pages = [], None, 0
        while True:
            doc = server.api("thread/main?limit=200" + (f"&cursor={cursor}" if cursor else ""))
            assert len(doc["checkpoints"]) <= 200
            seen += doc["checkpoints"]
            pages += 1
            cursor = doc["next_cursor"]
            if cursor is None:
                break
        assert pages == 2 and seen == log
        page = server.get("/thread/main")
        assert page.count("data-checkpoint=") == 50                     # the HTML page's default
        page = server.get("/thread/main?limit=200")
        assert page.count("data-checkpoint=") == 200
        ids = re.findall(r'data-checkpoint="([0-9a-f]{64})"', page)
        assert ids == [e["checkpoint"] for e in log[:200]]
        nxt = html.unescape(re.search(r'class="next" href="([^"]+)"', page).group(1))
        rest = re.findall(r'data-checkpoint="([0-9a-f]{64})"', server.get(nxt))
        assert rest == [e["checkpoint"] for e in log[200:]]
        assert server.request("/thread/main?limit=201")[0] == 400
    finally:
        server.stop()


def test_checkpoint_files_are_paged(long_thread):
    server = UiServer(long_thread)
    try:
        files = run_cli("--json", "show", "main", "--files", store=long_thread).json()["files"]
        assert len(files) == 206
        first = server.api("checkpoint/main")
        assert len(first["files"]) == 200 and first["next_cursor"] == "200"
        second = server.api("checkpoint/main?cursor=200")
        assert first["files"] + second["files"] == files and second["next_cursor"] is None
        page = server.get("/checkpoint/main")
        assert page.count("data-file=") == 200 and "more files" in page
    finally:
        server.stop()


def test_lineage_is_folded_beyond_a_bound_with_the_way_to_unfold(long_thread):
    server = UiServer(long_thread)
    try:
        page = server.get("/")
        nodes = re.findall(r'<g class="thread" data-thread="([^"]+)"', page)
        assert len(nodes) <= 200 and nodes[0] == "main"
        edges = re.findall(r'data-parent="([^"]+)" data-child="([^"]+)"', page)
        assert edges and all(parent == "main" for parent, _ in edges)
        assert {child for _, child in edges} == set(nodes[1:])
        unfold = re.search(r'data-unfold="main"', page)
        assert unfold, "main's folded forks need a link"
        # Unfolding main shows its forks page by page until every one was shown.
        shown, url = set(), "/?root=main"
        while url:
            part = server.get(url)
            found = re.findall(r'<g class="thread" data-thread="([^"]+)"', part)
            assert len(found) <= 200
            shown.update(found)
            link = re.search(r'class="next" href="([^"]+)"', part)
            url = html.unescape(link.group(1)) if link else None
        assert shown == {"main"} | {f"fork-{n:03d}" for n in range(260)}
        # The page's size does not grow with the store: 260 forks, fewer than 200 rows.
        assert len(page) < 200 * 2000
    finally:
        server.stop()


def test_lineage_api_threads_are_paged_by_name(long_thread):
    server = UiServer(long_thread)
    try:
        every = run_cli("--json", "branch", store=long_thread).json()["threads"]
        got, cursor = [], None
        while True:
            doc = server.api("threads?limit=100" + (f"&cursor={cursor}" if cursor else ""))
            assert len(doc["threads"]) <= 100
            got += doc["threads"]
            cursor = doc["next_cursor"]
            if cursor is None:
                break
        assert got == every and len(got) == 261
    finally:
        server.stop()


# --- the pages' content ---------------------------------------------------------------------------

def test_thread_page_rows_carry_their_facts(ui, small_store):
    page = ui.get("/thread/alt")
    rows = re.findall(r'<tr data-checkpoint="([0-9a-f]{64})">', page)
    assert rows == [small_store["third"], small_store["second"], small_store["first"]]
    assert "on alt" in page and "absent" in page and "pending" in page
    assert 'href="/thread/main"' in page   # fork of main


def test_checkpoint_page_diffs_with_its_parent_and_any_other(ui, small_store):
    page = ui.get(f"/checkpoint/{small_store['second']}")
    assert re.search(r'data-diff="added"><td class="num">A</td><td class="path mono">new.txt', page)
    assert re.search(r'data-diff="changed"><td class="num">M</td><td class="path mono">notes.md', page)
    other = ui.get(f"/checkpoint/{small_store['third']}?against={small_store['first']}")
    assert "alt.txt" in other and "new.txt" in other
    assert ui.get(f"/diff?from={small_store['first']}&to={small_store['third']}") == other
    bad = ui.request(f"/checkpoint/{small_store['third']}?against=nothing-here")
    assert bad[0] == 200 and "nothing-here" in bad[2] and "error" in bad[2]


def test_checkpoint_page_shows_open_effects_after_it(ui, small_store):
    page = ui.get(f"/checkpoint/{small_store['third']}")
    assert "Recorded on alt after this checkpoint" in page and "pending" in page


# --- the shared store -----------------------------------------------------------------------------

def test_the_view_works_on_a_shared_store(tmp_path, s3_url, postgres_url, workspace):
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url, "AGENTCAS_CACHE_DIR": str(tmp_path / "cache")}
    assert run_cli("init", env=env).code == 0
    made = run_cli("--json", "commit", workspace, "-m", "on the shared store", env=env)
    assert made.code == 0, made
    assert run_cli("fork", "main", "shared-fork", env=env).code == 0
    server = UiServer(None, env=env)
    try:
        lineage = server.get("/")
        assert 'data-thread="main"' in lineage and 'data-child="shared-fork"' in lineage
        page = server.get("/thread/main")
        assert made.json()["checkpoint"] in page and "on the shared store" in page
        assert without_cursor(server.api("thread/main")) == run_cli("--json", "log", "main", env=env).json()
        assert "memory/notes.md" in server.get(f"/checkpoint/{made.json()['checkpoint']}")
    finally:
        assert server.stop() == 0


def test_each_checkpoint_row_counts_the_effects_in_its_own_history(store_dir, tmp_path):
    ws = write(tmp_path / "ws", {"a.txt": "1\n"})
    store = Store.open(str(store_dir))
    before = store.checkpoints.commit(str(ws), "before the request", "main").checkpoint
    effect = store.effects.add("main", "pending", "http.request", "https://example.test/pay", "irreversible")
    write(ws, {"a.txt": "2\n"})
    sent = store.checkpoints.commit(str(ws), "request sent", "main").checkpoint
    store.effects.add("main", "done", effect_id=effect.id)
    write(ws, {"a.txt": "3\n"})
    done = store.checkpoints.commit(str(ws), "request done", "main").checkpoint
    store.close()
    server = UiServer(store_dir)
    try:
        page = server.get("/thread/main")
        cells = dict(re.findall(r'<tr data-checkpoint="([0-9a-f]{64})">.*?<td>((?:<span[^>]*>[^<]*</span>)+)</td>\s*</tr>',
                                page, re.S))
        assert "1 done" in cells[done] and "pending" not in cells[done]
        assert "1 pending" in cells[sent]
        assert ">0<" in cells[before]
        assert server.get("/thread/main") == page   # asked again: the same counts
    finally:
        server.stop()


def test_another_loopback_address_is_served_under_its_own_name(small_store):
    server = UiServer(small_store["dir"], args=("--host", "127.0.0.2"))
    try:
        assert server.url.startswith("http://127.0.0.2:")
        assert server.request("/", host=f"127.0.0.2:{server.port}")[0] == 200
        assert server.request("/", host=f"localhost:{server.port}")[0] == 200
        assert server.request("/", host=f"127.0.0.1:{server.port}")[0] == 403
    finally:
        assert server.stop() == 0


def test_host_names_allowed_for_each_kind_of_bind():
    from types import SimpleNamespace

    from agentcas.ui.server import _host_allowed, allowed_hosts

    def allowed(bind: str, header: str) -> bool:
        return _host_allowed(SimpleNamespace(allowed_hosts=allowed_hosts(bind, 8080), port=8080), header)

    assert allowed("::1", "[::1]:8080") and allowed("::1", "localhost:8080") and not allowed("::1", "[::1]:8081")
    assert allowed("myhost.lan", "MyHost.lan:8080") and not allowed("myhost.lan", "localhost:8080")
    assert not allowed("192.0.2.7", "localhost:8080") and allowed("192.0.2.7", "192.0.2.7:8080")
    # A wildcard bind: any address literal with the port, never a name (a rebound name is refused).
    assert allowed("0.0.0.0", "192.0.2.7:8080") and allowed("0.0.0.0", "[::1]:8080")
    assert not allowed("0.0.0.0", "evil.example:8080") and not allowed("0.0.0.0", "192.0.2.7:9090")
    assert not allowed("127.0.0.1", None) and not allowed("127.0.0.1", "")
