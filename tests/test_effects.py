"""External-effects ledger: records, the side index, the Store API and the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcas import Store, testing_hooks
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import effects
from agentcas.lineage.effects_index import INDEX_FILE

from support.cli import run_cli
from support.store_state import store_rows


def add(store, thread, **kw):
    kw.setdefault("kind", "http.request")
    kw.setdefault("target", "https://api.example/x")
    kw.setdefault("rollback", "irreversible")
    return store.effects.add(thread, kw.pop("state", "pending"), kw.pop("kind"), kw.pop("target"),
                            kw.pop("rollback"), kw.pop("provider", None), kw.pop("operation", None),
                            kw.pop("effect_id", None))


# -- records -----------------------------------------------------------------------------------

def test_record_line_round_trips():
    rec = effects.new_effect("e1", "payment", "acct:42", "pending", "compensatable", "stripe", "charge",
                             "2026-01-01T00:00:00.000000Z")
    line = rec.to_line()
    assert line.endswith(b"\n") and json.loads(line)["type"] == "agentcas.effect"
    assert effects.parse_record(line) == rec
    change = effects.state_change("e1", "done", "2026-01-01T00:00:01.000000Z")
    assert effects.parse_record(change.to_line()) == change and not change.is_new


@pytest.mark.parametrize("raw", [b'{"type":"message","text":"agentcas.effect"}\n',
                                 b'{"type":"agentcas.effect","id":"x","state":"weird"}\n',
                                 b'{"type":"agentcas.effect","state":"done"}\n',
                                 b'["agentcas.effect"]\n', b'{"type":"agentcas.effect"'])
def test_other_and_malformed_records_are_not_effects(raw):
    assert effects.parse_record(raw) is None


@pytest.mark.parametrize("field, value", [("effect_id", "has space"), ("effect_id", "x" * 129),
                                          ("kind", "a\x00b"), ("kind", ""), ("target", "a\nb"),
                                          ("target", "x" * 5000), ("rollback", "maybe"),
                                          ("provider", "p\x1b[31m")])
def test_bad_fields_are_refused(field, value):
    args = dict(effect_id="e1", kind="k", target="t", state="pending", rollback="irreversible",
                provider=None, operation=None, at="2026-01-01T00:00:00.000000Z")
    args[field] = value
    with pytest.raises(effects.BadEffect):
        effects.new_effect(**args)


# -- Store API ---------------------------------------------------------------------------------

def test_add_update_and_list_latest_states(store):
    a = add(store, "main", provider="stripe", operation="charge")
    b = add(store, "main", kind="file.write", target="/srv/out", rollback="compensatable", state="unknown",
            effect_id="write-1")
    assert a.new and a.id.startswith("eff-") and (a.seq, b.seq) == (0, 1)
    up = store.effects.add("main", "done", effect_id=a.id)
    assert not up.new and up.seq == 2
    doc = store.effects.list("main").to_json()
    assert [e["id"] for e in doc["effects"]] == [a.id, "write-1"]  # newest activity first
    first = doc["effects"][0]
    assert (first["state"], first["first_seq"], first["state_seq"], first["provider"]) == ("done", 0, 2, "stripe")
    assert doc["totals"] == {"effects": 2, "by_state": {"done": 1, "unknown": 1},
                             "by_rollback": {"compensatable": 1, "irreversible": 1},
                             "by_provider": {"": 1, "stripe": 1}}
    assert [e["id"] for e in store.effects.list("main", states=["pending", "unknown"]).to_json()["effects"]] == ["write-1"]


def test_a_state_for_an_unknown_id_writes_nothing(store):
    add(store, "main", effect_id="e1")
    before = list(store.history.read("main"))
    with pytest.raises(NotFound, match="no effect 'nope'.*nothing was written"):
        store.effects.add("main", "done", effect_id="nope")
    with pytest.raises(NotFound):
        store.effects.add("other", "done", effect_id="e1")  # the id lives in main's history, not other's
    with pytest.raises(ConflictError, match="already exists"):
        add(store, "main", effect_id="e1")
    with pytest.raises(effects.BadEffect, match="needs --target, --rollback"):
        store.effects.add("main", "pending", kind="k")
    assert list(store.history.read("main")) == before


def _racing(store_dir, *cli_args):
    """A callback that lands a racing `agentcas effect add ...` (another process) once."""
    codes = []

    def race():
        if not codes:
            codes.append(run_cli("effect", "add", *cli_args, store=store_dir).code)
    return race, codes


def test_two_racing_state_updates_one_wins_the_other_conflicts(store_dir, store):
    add(store, "main", effect_id="pay-1")
    race, codes = _racing(store_dir, "main", "--id", "pay-1", "--state", "failed")
    with testing_hooks.on("effect.after_lookup", race):
        with pytest.raises(ConflictError, match="pay-1.*got state 'failed'.*nothing was written"):
            store.effects.add("main", "done", effect_id="pay-1")
    assert codes == [0]                       # the other update won
    assert store.threads.get("main").history.seq == 2   # and only its record landed
    latest, = store.effects.list("main").to_json()["effects"]
    assert latest["state"] == "failed"
    assert store.effects.add("main", "done", effect_id="pay-1").to_json()["state"] == "done"   # a re-read then succeeds


def test_a_new_effect_with_an_id_racing_the_same_id_conflicts(store_dir, store):
    add(store, "main", effect_id="other")
    race, codes = _racing(store_dir, "main", "--id", "job-9", "--kind", "k", "--target", "t", "--state",
                          "pending", "--rollback", "irreversible")
    with testing_hooks.on("effect.after_lookup", race):
        with pytest.raises(ConflictError, match="job-9"):
            add(store, "main", effect_id="job-9")
    assert codes == [0] and store.threads.get("main").history.seq == 2


def test_records_of_other_effects_landing_meanwhile_do_not_conflict(store_dir, store):
    add(store, "main", effect_id="a")
    add(store, "main", effect_id="b")
    race, codes = _racing(store_dir, "main", "--id", "b", "--state", "done")
    with testing_hooks.on("effect.after_lookup", race):
        assert store.effects.add("main", "failed", effect_id="a").to_json()["seq"] == 3   # after the other's record
    assert codes == [0]
    assert {e["id"]: e["state"] for e in store.effects.list("main").to_json()["effects"]} == {"a": "failed", "b": "done"}


def test_a_revert_landing_between_lookup_and_append_conflicts(store_dir, store, workspace):
    base = store.checkpoints.commit(str(workspace), "base").to_json()["checkpoint"]
    add(store, "main", effect_id="pay-2")
    store.checkpoints.commit(str(workspace), "after")
    codes = []

    def race():
        if not codes:
            codes.append(run_cli("revert", "main", base, store=store_dir).code)
    with testing_hooks.on("effect.after_lookup", race):
        with pytest.raises(ConflictError, match="another history"):
            store.effects.add("main", "done", effect_id="pay-2")
    assert codes == [0] and store.threads.get("main").history.seq == 0


def test_paging_resumes_and_the_last_page_ends(store):
    for i in range(23):
        add(store, "main", effect_id=f"e{i}", state=("done", "pending")[i % 2])
    seen, cursor = [], None
    while True:
        page = store.effects.list("main", limit=5, before=cursor).to_json()
        seen += [e["id"] for e in page["effects"]]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert seen == [f"e{i}" for i in reversed(range(23))]
    pending = store.effects.list("main", states=["pending"], limit=4).to_json()
    assert [e["id"] for e in pending["effects"]] == ["e21", "e19", "e17", "e15"] and pending["has_more"]


def test_effects_survive_fork_and_revert_as_evidence(store, workspace):
    store.checkpoints.commit(str(workspace), "before")
    add(store, "main", effect_id="charge", state="pending", rollback="compensatable")
    store.checkpoints.commit(str(workspace), "after")
    store.threads.fork("main", "explore")
    assert [e["id"] for e in store.effects.list("explore").to_json()["effects"]] == ["charge"]
    result = store.threads.revert("main", "main~1").to_json()
    assert result["effects"]["count"] == 1 and result["effects"]["effects"][0]["id"] == "charge"
    assert "undid none" in result["effects"]["note"]
    assert store.effects.list("main").to_json()["effects"] == []                 # not in the reverted history ...
    assert [e["id"] for e in store.effects.list("main@{1}").to_json()["effects"]] == ["charge"]  # ... still evidence
    assert [e["id"] for e in store.effects.list("explore").to_json()["effects"]] == ["charge"]


def test_since_counts_older_effects_changed_later(store, workspace):
    add(store, "main", effect_id="old")
    add(store, "main", effect_id="quiet", state="done")
    mark = store.checkpoints.commit(str(workspace), "mark").to_json()["checkpoint"]
    store.effects.add("main", "failed", effect_id="old")
    add(store, "main", effect_id="new")
    doc = store.effects.list("main", since=mark).to_json()
    assert doc["since_seq"] == 2 and {e["id"] for e in doc["effects"]} == {"old", "new"}
    assert doc["totals"]["by_state"] == {"failed": 1, "pending": 1}


def test_records_from_any_append_path_are_indexed(store):
    store.history.append("main", b'{"type":"message","text":"hi"}\n'
                         + effects.new_effect("hand", "k", "t", "pending", "irreversible", None, None,
                                              "2026-01-01T00:00:00.000000Z").to_line()
                         + b'{"type":"agentcas.effect","id":"ghost","state":"done"}\n')
    doc = store.effects.list("main").to_json()
    assert [e["id"] for e in doc["effects"]] == ["hand"] and doc["effects"][0]["first_seq"] == 1


def test_the_index_is_a_cache_and_rebuilds(store_dir):
    store = Store.open(str(store_dir))
    for i in range(5):
        add(store, "main", effect_id=f"e{i}")
    first = store.effects.list("main").to_json()
    (store_dir / INDEX_FILE).unlink()
    for extra in ("-wal", "-shm"):
        (store_dir / (INDEX_FILE + extra)).unlink(missing_ok=True)
    again = Store.open(str(store_dir)).effects.list("main").to_json()
    assert again["effects"] == first["effects"] and again["totals"] == first["totals"]


def naive(store, rev):
    """Effects and latest states recomputed from the raw history, the index's specification."""
    latest, order = {}, []
    for seq, line in enumerate(b"".join(store.history.read(rev)).splitlines(keepends=True)):
        rec = effects.parse_record(line)
        if rec is None or (rec.id not in latest and not rec.is_new):
            continue
        if rec.id not in latest:
            order.append(rec.id)
        latest[rec.id] = (rec.state, seq)
    return sorted(((i, latest[i][0]) for i in order), key=lambda x: -latest[x[0]][1])


def has_thread(store):
    return any(t["thread"] == "main" for t in [item.to_json() for item in store.threads.list()])


def has_checkpoint(store):
    return has_thread(store) and store.threads.get("main").checkpoint is not None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "state", "commit", "revert", "fork", "query"]),
                          st.integers(0, 50), st.sampled_from(effects.STATES)), max_size=30))
def test_index_agrees_with_the_history_through_reverts_and_forks(tmp_path_factory, ops):
    """Whatever order of appends, reverts, forks and queries: the index answers as a full scan would."""
    ws = tmp_path_factory.mktemp("ws")
    (ws / "f").write_text("x")
    store = Store.init(str(tmp_path_factory.mktemp("s") / "store"))[0]
    ids, forks = [], 0
    for op, n, state in ops:
        if op == "add":
            ids.append(add(store, "main", state=state).id)
        elif op == "state" and ids:
            try:
                store.effects.add("main", state, effect_id=ids[n % len(ids)])
            except NotFound:
                pass  # the id was reverted away
        elif op == "commit":
            store.checkpoints.commit(str(ws), f"c{n}")
        elif op == "revert" and has_checkpoint(store):
            back = min(n % 4, len(store.threads.log("main")) - 1)
            store.threads.revert("main", f"main~{back}")
        elif op == "fork" and has_thread(store):
            forks += 1
            store.threads.fork("main", f"f{forks}", at=n % (store.threads.get("main").history.seq + 1))
        revs = (["main"] if has_thread(store) else []) + [f"f{i}" for i in range(1, forks + 1)]
        if has_checkpoint(store):  # checkpoint prefixes and reflog states: queries below a line's end
            revs += [e["checkpoint"] for e in [item.to_json() for item in store.threads.log("main", 3)]] + ["main@{1}"] * (len(store.threads.reflog("main")) > 1)
        for rev in revs:
            got = [(e["id"], e["state"]) for e in store.effects.list(rev).to_json()["effects"]]
            assert got == naive(store, rev), rev


# -- CLI ---------------------------------------------------------------------------------------
# Stores used only through subprocesses, so this process may read them raw (store_rows).

@pytest.fixture
def cli_store(tmp_path, run):
    path = tmp_path / "cli-store"
    assert run("init", path).code == 0
    return path


def test_cli_effect_add_prints_a_generated_id_and_effects_lists(run, store_dir):
    r = run("effect", "add", "main", "--kind", "http.request", "--target", "https://x/pay", "--state",
            "pending", "--rollback", "irreversible", "--provider", "bank", "--operation", "pay", store=store_dir)
    assert r.code == 0, r
    effect_id = r.out.strip()
    assert effect_id.startswith("eff-")
    r = run("effect", "add", "main", "--id", effect_id, "--state", "unknown", store=store_dir)
    assert r.code == 0 and "state of effect" in r.out
    r = run("--json", "effects", "main", "--state", "pending,unknown", store=store_dir)
    doc = r.json()
    assert doc["effects"][0]["id"] == effect_id and doc["effects"][0]["state"] == "unknown"
    assert doc["totals"]["by_provider"] == {"bank": 1}
    r = run("effects", "main", store=store_dir)
    assert effect_id in r.out and "undid none" in r.out


@pytest.mark.parametrize("args, code, message", [
    (["--id", "missing", "--state", "done"], 1, "no effect 'missing'"),
    (["--kind", "k", "--target", "t", "--state", "maybe", "--rollback", "irreversible"], 2, "effect state must be"),
    (["--kind", "k", "--target", "t", "--state", "done", "--rollback", "undo"], 2, "rollback class must be"),
    (["--kind", "k", "--state", "done"], 2, "needs --target, --rollback"),
    (["--kind", "k", "--target", "t", "--state", "done", "--rollback", "irreversible", "--id", "bad id"],
     2, "effect id must be"),
    (["--kind", "k\x01", "--target", "t", "--state", "done", "--rollback", "irreversible"], 2, "control"),
    (["--kind", "k", "--target", "t", "--state", "done", "--rollback", "irreversible", "--id", "taken"],
     3, "already exists"),
])
def test_cli_bad_effect_input_is_refused_and_writes_nothing(run, cli_store, args, code, message):
    store_dir = cli_store
    r = run("effect", "add", "main", "--kind", "k", "--target", "t", "--state", "done", "--rollback",
            "irreversible", "--id", "taken", store=store_dir)
    assert r.code == 0, r
    before = store_rows(store_dir)
    r = run("effect", "add", "main", *args, store=store_dir)
    assert r.code == code and message in r.err and r.err.startswith("agentcas: error:"), r
    assert "Traceback" not in r.err
    assert store_rows(store_dir) == before


def test_cli_effects_bad_input(run, store_dir):
    assert run("effects", "nowhere", store=store_dir).code == 1
    r = run("effects", "main", "--state", "pending,bogus", store=store_dir)
    assert r.code in (1, 2) and "effect state must be" in r.err


def test_cli_revert_and_checkout_print_open_effects_and_undo_none(run, store_dir, workspace, tmp_path):
    assert run("commit", workspace, "-m", "before", store=store_dir).code == 0
    for state, eid in (("pending", "p1"), ("unknown", "u1"), ("done", "d1")):
        assert run("effect", "add", "main", "--id", eid, "--kind", "payment", "--target", "acct:7",
                   "--state", state, "--rollback", "compensatable", store=store_dir).code == 0
    assert run("commit", workspace, "-m", "after", store=store_dir).code == 0
    r = run("checkout", "main~1", tmp_path / "out", store=store_dir)
    assert r.code == 0 and "2 pending or unknown effects" in r.err and "checkout undid none" in r.err
    assert "p1" in r.err and "u1" in r.err and "d1" not in r.err
    r = run("--json", "revert", "main", "main~1", store=store_dir)
    doc = r.json()
    assert doc["effects"]["count"] == 2 and {e["id"] for e in doc["effects"]["effects"]} == {"p1", "u1"}
    r = run("revert", "main", "main@{1}", store=store_dir)  # forward again: nothing after the target
    assert r.code == 0 and "pending or unknown" not in r.err
    r = run("revert", "main", "main~1", store=store_dir)
    assert "revert undid none of them" in r.err


def test_usage_errors_of_the_api(store):
    with pytest.raises(UsageError):
        store.effects.list("main", limit=0)


def test_window_totals_match_a_full_count_for_every_since(store, workspace):
    """Totals with --since (computed from running totals and superseded rows) equal a direct count."""
    import random
    rng = random.Random(7)
    marks, ids = [], []
    for step in range(40):
        if ids and rng.random() < 0.4:
            store.effects.add("main", rng.choice(effects.STATES), effect_id=rng.choice(ids))
        else:
            ids.append(add(store, "main", state=rng.choice(effects.STATES),
                           rollback=rng.choice(effects.ROLLBACK_CLASSES), provider=rng.choice([None, "a", "b"])).id)
        if step % 5 == 4:
            marks.append(store.checkpoints.commit(str(workspace), f"m{step}").to_json()["checkpoint"])
    everything = store.effects.list("main").to_json()["effects"]
    for mark in marks:
        doc = store.effects.list("main", since=mark).to_json()
        window = [e for e in everything if e["state_seq"] >= doc["since_seq"]]
        assert [e["id"] for e in doc["effects"]] == [e["id"] for e in window]
        expect = {"effects": len(window), "by_state": {}, "by_rollback": {}, "by_provider": {}}
        for e in window:
            for key, value in (("by_state", e["state"]), ("by_rollback", e["rollback"]),
                               ("by_provider", e["provider"] or "")):
                expect[key][value] = expect[key].get(value, 0) + 1
        assert doc["totals"] == expect


def test_an_index_that_cannot_be_opened_falls_back_to_memory(tmp_path):
    """The index is a cache: if its file cannot be opened (here a directory stands in its
    place, as unwritable as a read-only mount, even for root), effects still answer."""
    store, _ = Store.init(str(tmp_path / "s"))
    add(store, "main", effect_id="e1")
    again = Store.open(str(tmp_path / "s"))
    (tmp_path / "s" / INDEX_FILE).mkdir()
    assert [e["id"] for e in again.effects.list("main").to_json()["effects"]] == ["e1"]


def test_effects_travel_in_a_bundle_with_their_thread(store, workspace, tmp_path):
    add(store, "main", effect_id="charge", state="pending", provider="bank")
    store.effects.add("main", "unknown", effect_id="charge")
    store.checkpoints.commit(str(workspace), "with effects")
    store.remotes.export_bundle("main", str(tmp_path / "main.bundle"))
    other, _ = Store.init(str(tmp_path / "other"))
    other.remotes.import_bundle(str(tmp_path / "main.bundle"), as_thread="theirs", allow_unsigned=True)
    doc = other.effects.list("theirs").to_json()
    assert [(e["id"], e["state"], e["provider"]) for e in doc["effects"]] == [("charge", "unknown", "bank")]
