"""`agentcas ui` in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium, clicking from the lineage to a thread to a checkpoint.

With AGENTCAS_UI_SCREENSHOTS=DIR (`make screenshots` sets docs/ui) the pages are saved there
as PNG files; docs/UI.md shows them.
"""

from __future__ import annotations

import os
import shutil

import pytest

from agentcas import Store

from support.cli import run_cli
from support.harness_samples import ClaudeSession
from support.ui_server import UiServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HOSTILE_THREAD = "<img/src=x/onerror=document.title='owned'>"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):
        raise RuntimeError("chromium and chromedriver are missing: `make test` installs them "
                           "(scripts/install-services.sh)")
    pytest.skip("chromium/chromedriver not installed (make test installs them)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def write(root, files: dict):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data)
    return root


@pytest.fixture
def demo_store(store_dir, tmp_path):
    """An agent's store: main with checkpoints, two forks (one forked again), an effect, a
    hostile thread name, and an ingested Claude Code session with its replay."""
    ws = write(tmp_path / "ws", {"memory/notes.md": "plan: fix the login timeout\n", "task.json": '{"step": 1}\n'})
    rollout = tmp_path / "rollout.jsonl"
    lines = []
    store = Store.open(str(store_dir))

    def step(thread: str, reason: str, files: dict, records: int):
        write(ws, files)
        for _ in range(records):
            lines.append(f'{{"role":"assistant","text":"step {len(lines)}"}}\n')
        rollout.write_text("".join(lines))
        return store.checkpoints.commit(str(ws), reason, thread, str(rollout) if thread == "main" else None).checkpoint

    step("main", "read the failing test", {}, 4)
    step("main", "reproduce the timeout", {"repro.py": "import time\n"}, 6)
    step("main", "fix: raise the login timeout to 30s", {"src/login.py": "TIMEOUT = 30\n"}, 8)
    store.threads.fork("main", "try-retry", 10)
    store.threads.fork("main", "try-async")
    write(ws, {"src/login.py": "RETRIES = 3\n"})
    store.checkpoints.commit(str(ws), "alternative: retry three times", "try-retry")
    store.threads.fork("try-retry", "try-retry-backoff")
    write(ws, {"src/login.py": "RETRIES = 3\nBACKOFF = 2\n"})
    store.checkpoints.commit(str(ws), "retry with exponential backoff", "try-retry-backoff")
    store.effects.add("main", "pending", "http.request", "POST https://deploy.example/staging", "compensatable",
                     "deployer", "deploy")
    store.threads.fork("main", HOSTILE_THREAD, 2)
    store.close()
    session = ClaudeSession()
    session.prompt("Fix the login timeout in src/login.py")
    session.say("I'll look at the test first.")
    session.tool("Bash", "pytest -q tests/test_login.py", "1 failed")
    session.say("The timeout is 5s; raising it to 30s.")
    path = tmp_path / "projects" / "-home-u-proj" / f"{session.session_id}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(session.data())
    assert run_cli("ingest", "claude", tmp_path / "projects", store=store_dir).code == 0
    for args in (("keygen", "alice", "--out", tmp_path), ("trust", "add", "alice", tmp_path / "alice.pub"),
                 ("sign", "try-retry", "--key", tmp_path / "alice.key")):
        assert run_cli(*args, store=store_dir).code == 0
    return store_dir, f"claude/{session.session_id}"


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
                 "--window-size=1320,900", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def screenshot(driver, name: str) -> None:
    where = os.environ.get("AGENTCAS_UI_SCREENSHOTS")
    if where:
        os.makedirs(where, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1320, min(max(height, 400), 1000))
        driver.save_screenshot(os.path.join(where, f"{name}.png"))
        driver.set_window_size(1320, 900)


def assert_no_injected_markup(driver) -> None:
    assert driver.find_elements(By.CSS_SELECTOR, "script") == []
    assert driver.find_elements(By.CSS_SELECTOR, "img") == []
    assert driver.title != "owned"   # the handler would have set it
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - raises when there is none


def test_click_from_the_lineage_to_a_thread_to_a_checkpoint(demo_store, browser):
    store_dir, _ = demo_store
    server = UiServer(store_dir)
    try:
        browser.get(server.url)   # the token in the query sets the cookie the later clicks use
        nodes = {n.get_attribute("data-thread") for n in browser.find_elements(By.CSS_SELECTOR, "g[data-thread]")}
        assert {"main", "try-retry", "try-async", "try-retry-backoff", HOSTILE_THREAD} <= nodes
        edges = {(e.get_attribute("data-parent"), e.get_attribute("data-child"))
                 for e in browser.find_elements(By.CSS_SELECTOR, "[data-parent][data-child]")}
        assert {("main", "try-retry"), ("main", "try-async"), ("try-retry", "try-retry-backoff"),
                ("main", HOSTILE_THREAD)} <= edges
        assert_no_injected_markup(browser)
        screenshot(browser, "lineage")

        browser.find_element(By.CSS_SELECTOR, 'g[data-thread="try-retry"] a').click()
        assert browser.current_url.endswith("/thread/try-retry")
        rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-checkpoint]")
        assert len(rows) == 3 and "alternative: retry three times" in rows[0].text
        assert "valid" in rows[0].text and "absent" in rows[1].text   # signed by a trusted key
        first = rows[0].get_attribute("data-checkpoint")
        assert len(first) == 64
        screenshot(browser, "thread")

        rows[0].find_element(By.CSS_SELECTOR, "a").click()
        assert browser.current_url.endswith(f"/checkpoint/{first}")
        assert browser.find_element(By.CSS_SELECTOR, f'[data-checkpoint="{first}"]')
        diff = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-diff]")]
        assert any("src/login.py" in text for text in diff)   # the parent (seq 10) had no src/login.py
        screenshot(browser, "checkpoint")

        # Back up the lineage through the thread link, and to the hostile name's page.
        browser.find_element(By.CSS_SELECTOR, "header a").click()
        browser.find_element(By.CSS_SELECTOR, f'g[data-thread="{HOSTILE_THREAD}"] a').click()
        assert "/thread/" in browser.current_url
        assert HOSTILE_THREAD in browser.find_element(By.CSS_SELECTOR, "h1").text
        assert_no_injected_markup(browser)
    finally:
        assert server.stop() == 0


def test_a_harness_checkpoint_shows_the_replay_and_effects(demo_store, browser):
    store_dir, session_thread = demo_store
    server = UiServer(store_dir)
    try:
        browser.get(server.url)
        browser.find_element(By.CSS_SELECTOR, f'g[data-thread="{session_thread}"] a').click()
        browser.find_element(By.CSS_SELECTOR, "tr[data-checkpoint] a").click()
        replay = browser.find_element(By.CSS_SELECTOR, "pre.replay").text
        assert "Fix the login timeout in src/login.py" in replay and "raising it to 30s" in replay
        screenshot(browser, "replay")

        browser.get(f"{server.base}/thread/main")
        effects = browser.find_elements(By.CSS_SELECTOR, "tr[data-effect]")
        assert len(effects) == 1 and "pending" in effects[0].text and "deploy.example" in effects[0].text
        # A checkpoint before the effect: the effect is recorded after it, open, not undone.
        browser.find_element(By.CSS_SELECTOR, "tr[data-checkpoint] a").click()
        assert "Recorded on main after this checkpoint" in browser.page_source
    finally:
        assert server.stop() == 0
