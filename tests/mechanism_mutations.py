"""Re-run the proofs of docs/RELIABILITY.md: remove each safety mechanism, watch its test fail.

    .venv/bin/python tests/mechanism_mutations.py            # every mutation
    .venv/bin/python tests/mechanism_mutations.py 1 7 S3 La  # some of them

Each mutation replaces exact text at a mechanism's site, runs the tests that guard it,
and restores the file (also on Ctrl-C). CAUGHT means a guarding test failed, as it
must; MISSED means the tests passed without the mechanism; MOVED means the site's
text is no longer in that file (after a refactor: update the mutation, then re-run).
Not collected by pytest (the name does not start with test_); it runs the suite itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = "tests/test_mechanisms.py::"

# Every writer's lease taken only in its final transaction (as the old lazy pin, when its
# row was never written): writers store objects with no lease for gc to see.
LATE_LEASE = (["    def __enter__(self) -> Lease:\n        return self.acquire()\n",
               "        value = txn.get(\"leases\", self.key, for_update=True)\n"],
              ["    def __enter__(self) -> Lease:\n        return self\n",
               "        txn.put(\"leases\", self.key, self._row(time.time()).encode())\n"
               "        value = txn.get(\"leases\", self.key, for_update=True)\n"])

# ... and a one-thread move's landing (lineage/moves.py) takes its lease row in its exchange.
LATE_LEASE_MOVE = ("agentcas/lineage/moves.py", ["        self.lease.check_clock()\n"],
                   ["        self.lease.row, self.lease.value = self.lease._row(__import__('time').time()), None\n"])

# name: (file, [original text], [mutated text], tests that must fail[, (file, [original], [mutated])...])
MUTATIONS = {
    "1": ("agentcas/cas/leases.py", *LATE_LEASE,
          [M + "test_commit_pin_is_live_after_its_first_batch_and_holds_gc_off"], LATE_LEASE_MOVE),
    "1-langgraph": ("agentcas/cas/leases.py", *LATE_LEASE,
                    ["tests/test_langgraph_saver.py::test_gc_at_grace_zero_during_a_put_deletes_nothing_and_the_put_lands"]),
    "1-concurrent": ("agentcas/cas/leases.py", *LATE_LEASE,
                     ["tests/test_gc_concurrency.py::test_concurrent_writers_and_gc_at_zero_grace"], LATE_LEASE_MOVE),
    "2": ("agentcas/workspace/restore.py", ["    if hasher is not None and Digest(hasher.digest()) != entry.id:"],
          ["    if False:"], [M + "test_checkout_refuses_a_chunk_list_of_other_bytes_with_the_same_sizes"]),
    "3": ("agentcas/exchange/bundle_format.py",
          ["        data = read_record_value(framed, kind, Digest(raw))\n        index.kinds[raw] = kind"],
          ["        data = (read_record_value(framed, kind, Digest(raw)) if kind != framing.KIND_CHUNK\n"
           "                else framing.unframe(framed)[1])\n        index.kinds[raw] = kind"],
          [M + "test_bundle_with_its_last_chunk_flipped_is_refused_before_anything_is_written"]),
    "4": ("agentcas/exchange/bundle.py", ["        history.verify(head_cp.history)\n"], ["        pass\n"],
          [M + "test_import_reverifies_a_rehashed_segment_whose_digest_or_count_lies[digest]",
           M + "test_import_reverifies_a_rehashed_segment_whose_digest_or_count_lies[count]"]),
    "5": ("agentcas/gc/sweep.py", ["previous is not None and previous[0] == name and previous[2] < cutoff"],
          ["previous is not None and previous[2] < cutoff"],
          [M + "test_expire_reflog_now_keeps_each_threads_newest_entry"]),
    "6": ("agentcas/lineage/moves.py", ["    missing = backends.source.missing(needed)\n    if missing:\n"],
          ["    missing = backends.source.missing(needed)\n    if False:\n"],
          [M + "test_commit_reusing_only_old_garbage_fails_cleanly_when_gc_runs_before_it_lands"]),
    "7": ("agentcas/workspace/commit.py", ["            if expect is not None and current != expected:"], ["            if False:"],
          [M + "test_commit_expect_is_rechecked_when_the_thread_moves_during_the_snapshot"]),
    "8": ("agentcas/workspace/commit.py", ["                if history != tail.based_on:"], ["                if False:"],
          [M + "test_commit_rollout_is_rechecked_when_the_history_moves_during_the_commit"]),
    "9": ("agentcas/exchange/bundle.py", ["                if state != before:"], ["                if False:"],
          [M + "test_import_is_a_conflict_when_the_thread_moves_while_it_writes"]),
    "10": ("agentcas/workspace/restore.py",
           ["        if os.path.lexists(dest):\n            raise ConflictError(f\"destination appeared"],
           ["        if False:\n            raise ConflictError(f\"destination appeared"],
           [M + "test_checkout_never_replaces_a_dest_created_while_it_ran"]),
    "11": ("agentcas/gc/sweep.py", ["            if plan.is_young(written_at):\n                continue\n"], [""],
           [M + "test_sweep_keeps_an_object_stored_again_after_planning"]),
    "12": ("agentcas/lineage/rollout.py", ["        if len(raw) > MAX_RECORD_BYTES:"], ["        if False:"],
           [M + "test_a_record_longer_than_the_limit_is_refused_by_its_line_number"]),
    # ... at its exact boundary, either way off by one.
    "12a": ("agentcas/lineage/rollout.py", ["        if len(raw) > MAX_RECORD_BYTES:"], ["        if len(raw) >= MAX_RECORD_BYTES:"],
            [M + "test_a_record_of_exactly_the_limit_is_accepted_and_one_byte_more_refused"]),
    "12b": ("agentcas/lineage/rollout.py", ["        if len(raw) > MAX_RECORD_BYTES:"], ["        if len(raw) > MAX_RECORD_BYTES + 1:"],
            [M + "test_a_record_of_exactly_the_limit_is_accepted_and_one_byte_more_refused"]),
    # The three sharpened tests.
    "S1": ("agentcas/exchange/bundle_format.py",
           ["    if manifest.object_bytes > size - objects_start:\n        raise BundleCorrupt(\"bundle is truncated "
            "(shorter than the object bytes its manifest declares)\")\n"], [""],
           ["tests/test_bundle.py::test_truncation_at_every_section_is_refused"]),
    "S2": ("agentcas/exchange/bundle_format.py",
           ["        data = read_record_value(framed, kind, Digest(raw))\n        index.kinds[raw] = kind"],
           ["        data = read_record_value(framed, framing.read_header(framed)[0], Digest(raw))\n"
            "        index.kinds[raw] = kind"],
           ["tests/test_bundle.py::test_object_defects_are_refused[kind-mismatch]"],
           # and the closure walk's own kind check, so the kind is checked only while writing:
           ("agentcas/lineage/closure.py", ["        if header[0] != kind:\n"], ["        if False:\n"])),
    "S3": ("agentcas/lineage/rollout.py", ["if skip is not None and skip_index(at) >= index:"],
           ["if skip is not None and skip_index(at) > index:"],
           ["tests/test_rollout.py::test_appends_load_log_n_segments"]),
    # The lease protocol (cas/leases.py): gc and writers without one transaction spanning both.
    "La": ("agentcas/lineage/moves.py",
           ["        self.lease.check_clock()\n", "        expect.append(self.lease.expect())\n"], ["", ""],
           [M + "test_a_writer_whose_lease_is_lost_fails_with_lease_expired_and_moves_nothing[deleted]",
            M + "test_a_writer_whose_lease_is_lost_fails_with_lease_expired_and_moves_nothing[expired]"]),
    "Lb": ("agentcas/cas/leases.py", ["        if row.live(now):\n            live.append(row)\n"],
           ["        if row.live(now):\n            pass\n"],
           [M + "test_gc_at_grace_zero_deletes_nothing_while_a_lease_is_live"]),
    "Lc": ("agentcas/cas/leases.py",
           ["            txn.put(\"leases\", self.key, row.encode())\n            return (\"wait\" if active else \"held\"), row\n",
            "            return \"defer\", None\n        return (\"wait\" if active else \"held\"), row\n"],
           ["            if not active:\n                txn.put(\"leases\", self.key, row.encode())\n"
            "            return (\"wait\" if active else \"held\"), row\n",
            "            return \"defer\", None\n        if active:\n            self.meta.exchange(writes=[(\"leases\", self.key, None)])\n"
            "        return (\"wait\" if active else \"held\"), row\n"],
           [M + "test_a_writer_waiting_for_a_sweep_batch_already_holds_off_the_next_batch"]),
    "Ld": ("agentcas/cas/leases.py",
           ["        if self.host == (host or this_host()) and not pid_alive(self.pid):\n            return False\n"],
           [""], [M + "test_the_lease_of_a_killed_local_writer_is_dead_at_once"]),
    # The move engine (lineage/moves.py) as the LangGraph saver's group moves use it: objects
    # stored before the refs move (here: after, so a kill in between leaves a ref to missing
    # objects), and the landing's compare-and-swap (here: a ref that moved is overwritten or its
    # move silently dropped).
    "G1": ("agentcas/lineage/moves.py",
           ["        staged = store_objects(self.backends, landing.objects, landing.needed - landing.objects.keys(),\n"
            "                               landing.action)\n",
            "            self.backends.meta.write(partial(self._final, landing=landing, staged=staged))\n"],
           ["        staged = []\n",
            "            self.backends.meta.write(partial(self._final, landing=landing, staged=staged))\n"
            "        self.backends.source.put_many(landing.objects)\n"],
           ["tests/test_langgraph_saver.py::test_every_crash_point_of_a_put_leaves_the_old_or_the_new_checkpoint"]),
    # ... and the same on the embedded store, where objects and refs land in one transaction
    # (here: the objects in a transaction of their own after the refs moved).
    "G1w": ("agentcas/lineage/moves.py",
            ["        for raw, framed in landing.objects.items():\n            save_object(txn, Digest(raw), framed)\n",
             "            self.backends.meta.write(partial(self._land_at_once, landing=landing))\n"],
            ["",
             "            self.backends.meta.write(partial(self._land_at_once, landing=landing))\n"
             "            self.backends.source.put_many(landing.objects)\n"],
            ["tests/test_langgraph_saver.py::test_every_crash_point_of_a_put_leaves_the_old_or_the_new_checkpoint"]),
    # A leaseless (SweepWatch) writer's landing checks that no gc sweep began since it started
    # (here: it lands regardless, as if it had held a lease it never took).
    "G3": ("agentcas/lineage/moves.py", ["        self.watch.check(txn)\n"], [""],
           ["tests/test_langgraph_saver.py::"
            "test_gc_at_grace_zero_during_a_leaseless_put_sweeps_garbage_and_the_put_plans_again"]),
    "G2": ("agentcas/lineage/moves.py",
           ["        if threads.read_thread(txn, name) != state:\n            raise LostRace(name)\n",
            "        if not threads.set_if_equals(txn, name, old, new, action, message, implied):\n"
            "            raise LostRace(name)\n"],
           ["        pass\n",
            "        threads.set_if_equals(txn, name, old, new, action, message, implied)\n"],
           ["tests/test_langgraph_saver.py::test_a_ref_moved_between_planning_and_landing_makes_the_put_plan_again"]),
    "Le": ("agentcas/gc/sweep.py", ["        if time.time() > began + SWEEP_WINDOW - WINDOW_MARGIN:\n"],
           ["        if False:\n"], [M + "test_a_sweep_batch_past_its_window_deletes_nothing"]),
    # A shared store's fsck reads the bucket (here: this machine's cache, which may hold a good
    # copy of an object the bucket holds damaged), and a commit whose cache knew objects that gc
    # elsewhere deleted snapshots again asking the bucket (here: fails on every rerun).
    # A compressed pack's frame carries zstd's checksum (cas/framing.py `compress_checked`):
    # without it, a flipped bit that still decompresses reads as other records.
    # (here: written without it, and read without asking for it).
    "Pz": ("agentcas/cas/framing.py", ["                                                             write_checksum=True)"],
           ["                                                             write_checksum=False)"],
           ["tests/test_packs.py::test_every_flipped_bit_of_a_compressed_pack_is_named_as_damage",
            "tests/test_packs.py::test_a_compressed_pack_whose_frame_has_no_checksum_is_refused"],
           ("agentcas/cas/packs.py",
            ["        if not zstandard.get_frame_parameters(stored[PACK_HEADER.size:]).has_checksum:\n"],
            ["        if False:\n"])),
    # Inflated packs are reused only for a pack of the very same bytes (cas/packs.py `plain`).
    "Pi": ("agentcas/cas/packs.py", ["    if known is not None and known[0] == stored:\n"],
           ["    if known is not None:\n"],
           ["tests/test_packs.py::test_packs_of_the_same_number_in_two_stores_read_each_their_own"]),
    # A shared store's gc deletes packs no index row names only in a fenced batch (no writer
    # holds a lease, so none is between its pack upload and its rows); here: at once.
    "Pu": ("agentcas/gc/sweep.py", ["    if live:\n        return {\"skipped\": \"writers\"}\n"],
           ["    if False:\n        return {\"skipped\": \"writers\"}\n"],
           ["tests/test_shared_packs.py::"
            "test_gc_at_grace_zero_keeps_the_pack_a_writer_has_uploaded_but_not_yet_indexed"]),
    "Fb": ("agentcas/gc/fsck.py", ["    values = blobs.get_many_stored("],
           ["    values = blobs.get_many("],
           ["tests/test_shared_store_machines.py::test_fsck_on_the_machine_that_wrote_reads_the_bucket_not_its_cache"]),
    "Fm": ("agentcas/gc/fsck.py", ["        return self.listed is not None and digest.raw not in self.listed\n"],
           ["        return False\n"],
           ["tests/test_shared_store_machines.py::"
            "test_fsck_names_an_object_the_bucket_lost_even_where_the_cache_holds_it"]),
    "Vc": ("agentcas/workspace/commit.py", ["            if known is None:\n                raise\n"],
           ["            raise\n"],
           ["tests/test_shared_store_machines.py::"
            "test_a_commit_after_gc_on_another_machine_deleted_what_this_cache_remembers"]),
    # gc's mark set moves its ids to disk past its memory budget (gc/markset.py): drop them instead.
    "Gm": ("agentcas/gc/markset.py",
           ["            txn.cursor().putmulti(((raw, b\"\") for raw in batch), overwrite=False)\n"],
           ["            pass\n"],
           ["tests/test_gc_markset.py::test_markset_spills_past_its_budget_and_finds_every_id_in_both_tables",
            "tests/test_gc_markset.py::test_gc_with_a_tiny_memory_budget_deletes_exactly_the_garbage_on_lmdb"]),
    # The spilled mark table's Bloom filter not told of the ids moved to disk: marked ids are
    # taken for unmarked (gc would delete live objects), or, always "maybe", every lookup reads the disk.
    "Gb": ("agentcas/gc/markset.py", ["        for raw in batch:\n            self._remember_on_disk(raw)\n"],
           ["        pass\n"],
           ["tests/test_gc_markset.py::test_markset_spills_past_its_budget_and_finds_every_id_in_both_tables",
            "tests/test_gc_markset.py::test_gc_with_a_tiny_memory_budget_deletes_exactly_the_garbage_on_lmdb"]),
    "Gf": ("agentcas/gc/markset.py", ["        if self._reader is None or not self._maybe_on_disk(raw):\n"],
           ["        if self._reader is None:\n"],
           ["tests/test_gc_markset.py::test_a_spilled_markset_reads_its_on_disk_table_for_few_absent_ids"]),
    # A listing in pack order that takes every record for an object: the dead records of a
    # partly dead pack are listed (gc would count them, and plan deletes of what is gone).
    "Gp": ("agentcas/cas/packs.py", ["            if all_live or _indexed_at(txn, raw, number, at):\n"],
           ["            if True:\n"],
           ["tests/test_packs.py::test_a_listing_in_pack_order_lists_exactly_what_the_id_order_listing_does"]),
    # `commit --rollout` passes over the effect records agentcas appended itself (lineage/tail.py):
    # take them for the file's, and an effect then refuses the next commit of the grown file.
    "Re": ("agentcas/lineage/tail.py", ["        elif parse_record(record) is None:  # not agentcas's own"],
           ["        elif True:  # not agentcas's own"],
           ["tests/test_rollout_file.py::test_an_effect_then_a_commit_of_the_grown_file"]),
    # ... and still checks, from the place its checkpoint recorded, that the file ends with the
    # last append it stored: without it, an edit there is taken in silently.
    "Rt": ("agentcas/lineage/tail.py", ["                _match_backwards(file, last[:seq - last_segment.base.seq], offset)\n"],
           ["                pass\n"],
           ["tests/test_rollout_file.py::test_an_edit_in_the_last_stored_append_is_refused"]),
    # A damaged store file (cas/lmdb_pages.py, cas/fatal_signals.py): fsck checks the data
    # file's pages before LMDB reads them; other commands meet a SIGBUS with one line.
    "P0": ("agentcas/gc/fsck.py", ["        check_pages(backends.path)\n"], ["        pass\n"],
           ["tests/test_lmdb_pages.py::test_a_page_past_the_end_of_a_truncated_file_is_reported"]),
    "P1": ("agentcas/cas/lmdb_pages.py",
           ["    if offsets and (min(offsets) < upper or max(offsets) > page_size - NODE_HEADER):"],
           ["    if False:"],
           ["tests/test_lmdb_pages.py::test_every_byte_of_a_node_offset_is_checked"]),
    "F1": ("agentcas/cas/fatal_signals.py", ["    if _armed:\n        _install()\n"], ["    pass\n"],
           ["tests/test_lmdb_pages.py::test_other_commands_meeting_a_damaged_page_end_with_a_line_pointing_to_fsck"]),
    "C1": ("agentcas/cli.py", ["        if isinstance(exc, CORRUPTION):\n            return corrupt_store(exc)\n"],
           [""], ["tests/test_lmdb_pages.py::test_an_lmdb_corruption_error_is_an_integrity_error_with_one_line"]),
    # Whole or nothing on a full disk: init's lock file written out first; keygen's cleanup.
    "K1": ("agentcas/cas/lmdb_store.py", ["                _allocate_lock_file(self.path)\n"], [""],
           ["tests/test_system_errors.py::test_init_on_a_full_disk_is_whole_or_nothing"]),
    "K2": ("agentcas/signing/keys.py", ["                os.rmdir(directory)\n"], ["                pass\n"],
           ["tests/test_system_errors.py::test_keygen_on_a_full_disk_names_the_file_and_leaves_nothing"]),
    # Secrets: decoded JSON strings, reasons and names; the shipped window overlap.
    "J1": ("agentcas/exchange/secret_scan.py", ["    if any(escape in raw for escape in _HIDING_ESCAPES):"],
           ["    if False:"], ["tests/test_secret_scan.py::test_json_escapes_do_not_hide_a_secret_from_the_rollout_scan"]),
    "N1": ("agentcas/workspace/snapshot.py", ["                self._check_name_secret(rel_dir, name, prefix + name)\n"], [""],
           ["tests/test_secret_scan.py::test_a_secret_in_a_file_name_is_refused_at_commit_and_at_export"]),
    "N2": ("agentcas/workspace/commit.py", ["    check_reason_secret(reason, allow_secrets)\n"], [""],
           ["tests/test_secret_scan.py::test_a_secret_in_a_commit_reason_is_refused_at_commit_and_at_export_and_push"]),
    "N3": ("agentcas/exchange/bundle.py",
           ["        refuse_name_secrets(txn, records, \"export\", \"no bundle was written\", allow_secrets)\n"], [""],
           ["tests/test_secret_scan.py::test_a_secret_in_a_commit_reason_is_refused_at_commit_and_at_export_and_push",
            "tests/test_secret_scan.py::test_a_secret_in_a_file_name_is_refused_at_commit_and_at_export"]),
    "W1": ("agentcas/workspace/secrets.py", ["SCAN_OVERLAP = 64 * 1024"], ["SCAN_OVERLAP = 512"],
           ["tests/test_secret_scan.py::test_the_shipped_window_overlap_finds_a_long_secret_straddling_two_windows"]),
    # MCP: the echo of an unknown method, restored copies, cursors bound to their target.
    "M1": ("agentcas/mcp/server.py", ["        item = _bounded_echo(item)\n"], [""],
           ["tests/test_mcp.py::test_an_unknown_method_is_answered_without_echoing_its_whole_name"]),
    "M2": ("agentcas/workspace/snapshot.py",
           ["                        or os.path.isfile(os.path.join(path, RESTORED_MARKER))):"],
           ["                        ):"],
           ["tests/test_mcp.py::test_a_restored_copy_inside_the_workspace_is_left_out_of_later_checkpoints"]),
    "M3": ("agentcas/mcp/tools.py", ["        if doc[0] != tool or doc[1] != key:"], ["        if doc[0] != tool:"],
           ["tests/test_mcp.py::test_a_cursor_issued_for_one_thread_or_checkpoint_is_refused_for_another"]),
    # Terminal text: CR, VT and FF escaped in reports too; LangGraph string versions.
    "T1": ("agentcas/terminal_text.py", ['_UNSAFE_IN_LINES = re.compile(f"[\\x00-\\x08\\x0b-\\x1f{_UNSAFE}]")'],
           ['_UNSAFE_IN_LINES = re.compile(f"[\\x00-\\x08\\x0e-\\x1f{_UNSAFE}]")'],
           ["tests/test_terminal_text.py::test_carriage_return_vertical_tab_and_form_feed_are_escaped_like_other_controls"]),
    "V1": ("agentcas/langgraph/base.py",
           ["        if isinstance(current, str):\n            return int(current.split(\".\")[0]) + 1\n"], [""],
           ["tests/test_langgraph_saver.py::test_next_version_continues_the_counter_of_another_savers_string_version"]),
    "Sg": ("agentcas/gc/fsck.py", ["            elif not self.source.has(Digest(key[32:64])):\n"],
           ["            elif False:\n"],
           ["tests/test_fsck.py::test_fsck_reports_a_signature_listed_but_not_stored"]),
    "Hv": ("agentcas/lineage/rollout.py",
           ["        if (seq, offset, digest) != (head.seq, head.offset, head.digest):\n"], ["        if False:\n"],
           ["tests/test_rollout.py::test_history_verify_refuses_a_head_position_that_lies_about_its_prefix[digest]",
            "tests/test_rollout.py::test_history_verify_refuses_a_head_position_that_lies_about_its_prefix[seq]"]),
    # A server that stopped answering: the error's seconds cover the whole wait (a failed
    # writer gives its lease back without asking again; the seconds are rounded up).
    "Tw": ("agentcas/cas/leases.py", ["        if exc[0] is not None and issubclass(exc[0], MetadataUnavailable):\n"],
           ["        if False:\n"],
           ["tests/test_metastore_postgres.py::test_the_error_says_at_least_the_time_the_caller_waited"]),
    "Tr": ("agentcas/cas/retry.py", ["in {math.ceil(self.elapsed)}s"], ["in {self.elapsed:.0f}s"],
           ["tests/test_metastore_postgres.py::test_the_error_says_at_least_the_time_the_caller_waited"]),
    # PostgreSQL's exchange: a value expected on an absent row does not hold (here: it does).
    "Xa": ("agentcas/cas/metastore/postgres.py", ["        IF v IS DISTINCT FROM e_val[i] THEN\n"],
           ["        IF v IS NOT NULL AND v IS DISTINCT FROM e_val[i] THEN\n"],
           ["tests/test_metastore_conformance.py::test_exchange_reads_expects_and_writes_atomically[postgres]"]),
    # A shared store's refs database is used only beside its own prefix (here: beside any
    # initialised one, as long as some marker is there).
    "Bp": ("agentcas/cas/backends.py", ["    if marker is None or _marker_id(marker) != bound[\"id\"]:\n"],
           ["    if marker is None:\n"],
           ["tests/test_shared_store_urls.py::test_refs_of_one_store_beside_the_prefix_of_another_are_refused"]),
    # gc's roots: the newest reflog entry of every thread (here: of the last in key order only).
    "Rr": ("agentcas/gc/roots.py", ["                if current is not None:\n                    judge(*current)\n"],
           [""], ["tests/test_gc.py::test_every_threads_newest_reflog_entry_is_a_root_not_only_the_last_threads"]),
    # A sweep batch marks the signatures of checkpoints brought back since the plan.
    "Sb": ("agentcas/gc/sweep.py", ["                result.remarked += mark_signatures(txn, objects, plan.marked)\n"],
           ["                pass\n"],
           ["tests/test_gc.py::test_a_signed_checkpoint_brought_back_during_gc_keeps_its_signature"]),
    # Import refuses a rollback by ancestry too, which is all an unsigned bundle offers.
    "Ra": ("agentcas/exchange/bundle.py",
           ["    if not older:\n        older = is_ancestor(objects, checkpoint, Digest.parse(last[\"checkpoint\"]))\n"],
           [""], ["tests/test_bundle.py::test_an_unsigned_bundle_of_an_ancestor_is_refused_as_a_rollback"]),
    # Import's pass 2 re-verifies each record it writes (the file may change after pass 1).
    "I2": ("agentcas/exchange/bundle_format.py", ["            read_record_value(framed, kind, Digest(raw))\n"],
           ["            pass\n"], ["tests/test_bundle.py::test_a_bundle_changed_between_its_check_and_its_write_is_refused"]),
    # Ingest re-hashes the stored part of a file that only grew (a same-length edit there).
    "Ig": ("agentcas/harnesses/new_lines.py",
           ["            if job.prefix_digest is not None and hasher is not None and hasher.digest() != job.prefix_digest:\n"],
           ["            if False:\n"],
           ["tests/test_harness_ingest.py::test_a_same_length_edit_inside_the_ingested_part_of_a_grown_file_is_refused"]),
    # A segment's index follows its base's (fsck and import, through the closure walk).
    "Si": ("agentcas/lineage/rollout.py", ["            if base.index + 1 != segment.index:\n"], ["            if False:\n"],
           ["tests/test_fsck.py::test_a_segment_whose_index_does_not_follow_its_base_is_reported_and_refused"]),
    # Leases, three more: an expired lease is dead whoever holds it; a landing checks its own
    # lease's clock before sending; every batch of a long write refreshes the lease.
    "Lf": ("agentcas/cas/leases.py", ["        if self.expires_at + CLOCK_MARGIN < now:\n            return False\n"], [""],
           [M + "test_an_expired_lease_of_another_host_does_not_hold_gc_off"]),
    "Lg": ("agentcas/lineage/moves.py", ["        self.lease.check_clock()\n"], [""],
           ["tests/test_shared_store.py::test_a_landing_whose_own_lease_ran_out_by_the_clock_sends_nothing"]),
    "Lh": ("agentcas/cas/writer.py", ["            with self._lock:\n                self.lease.refresh()\n"],
           ["            with self._lock:\n                pass\n"],
           [M + "test_a_long_commit_refreshes_its_lease_and_lands_while_gc_runs"]),
    # The web view (agentcas/ui/server.py, pages.py, lineage_view.py): each check removed in turn.
    "Uh": ("agentcas/ui/server.py", ["        if not _host_allowed(self.server, self.headers.get(\"Host\")):\n"],
           ["        if False:\n"], ["tests/test_ui.py::test_a_host_header_naming_another_server_is_refused"]),
    "Ut": ("agentcas/ui/server.py", ["        if not hmac.compare_digest("], ["        if False and not hmac.compare_digest("],
           ["tests/test_ui.py::test_without_a_token_401_with_a_wrong_one_403"]),
    "Um": ("agentcas/ui/server.py", ["        if name.startswith(\"do_\"):\n"], ["        if False:\n"],
           ["tests/test_ui.py::test_only_get_and_head"]),
    "Ue": ("agentcas/ui/pages.py", ["autoescape=True"], ["autoescape=False"],
           ["tests/test_ui.py::test_a_hostile_thread_name_is_text_everywhere",
            "tests/test_ui.py::test_a_hostile_file_path_and_reason_are_text",
            "tests/test_ui.py::test_record_text_in_a_replay_is_text"]),
    "Uc": ("agentcas/ui/pages.py", ["        return escape_controls(value, lines=True)\n"], ["        return value\n"],
           ["tests/test_ui.py::test_control_and_bidi_characters_are_shown_as_escapes"]),
    "Uf": ("agentcas/ui/lineage_view.py", ["MAX_ROWS = 200\n"], ["MAX_ROWS = 100_000\n"],
           ["tests/test_ui.py::test_lineage_is_folded_beyond_a_bound_with_the_way_to_unfold"]),
    # Copied records (lineage/rollout.py RecordCopy): gc, bundles and pulls carry what a copy
    # reads; a claimed copy whose bytes differ is stored as bytes.
    "Cg": ("agentcas/lineage/closure.py", ["                    stack.append((segment.copy.source.segment, current))\n"],
           ["                    pass\n"],
           ["tests/test_rollout_copies.py::test_gc_keeps_what_a_fork_copies_after_its_parent_is_deleted[whole]",
            "tests/test_rollout_copies.py::test_a_bundle_of_the_fork_alone_carries_what_it_copies[hooks]"]),
    "Cb": ("agentcas/lineage/rollout.py",
           ["                if memoryview(piece)[at + record_head(piece, at, end):end] == memoryview(data)[mine:ends[line]]:\n"],
           ["                if True:\n"],
           ["tests/test_rollout_copies.py::test_an_edited_copy_is_stored_as_bytes"]),
    # The directory cache (workspace/snapshot.py): a directory with a racy entry, or below a
    # racy ignore file, gets no row; the ignore files above a directory are part of its key;
    # a directory whose key matches its row is taken from it.
    "Dr": ("agentcas/workspace/snapshot.py", ["            if racy or listing.newest > racy_before:\n"],
           ["            if racy:\n"],
           ["tests/test_directory_cache.py::test_a_rewrite_in_the_same_clock_tick_is_seen"]),
    "Di": ("agentcas/workspace/snapshot.py",
           ["                racy = racy or any(max(st.st_mtime_ns, st.st_ctime_ns) > racy_before for st in ignore_stats)\n"],
           [""],
           ["tests/test_directory_cache.py::test_an_ignore_file_rewritten_in_the_same_clock_tick_reaches_its_subdirectories"]),
    "Dc": ("agentcas/workspace/snapshot.py", ["            for part in (tag, context, skipped, listing.key):\n"],
           ["            for part in (tag, skipped, listing.key):\n"],
           ["tests/test_directory_cache.py::test_an_ancestors_ignore_file_reaches_directories_that_did_not_change"]),
    "Ds": ("agentcas/workspace/snapshot.py",
           ["len(context), len(skipped)), max_threads=1)\n", "            for part in (tag, context, skipped, listing.key):\n"],
           ["len(context), 0), max_threads=1)\n", "            for part in (tag, context, listing.key):\n"],
           ["tests/test_directory_cache.py::test_a_skipped_path_counts_for_its_own_directory_only"]),
    "Dh": ("agentcas/workspace/snapshot.py",
           ["            if row is not None and row[1] == self._own_digests[rel_dir]:\n"], ["            if False:\n"],
           ["tests/test_directory_cache.py::"
            "test_an_unchanged_directory_is_taken_from_its_row_and_only_the_changed_path_is_looked_at"]),
    # A session change (record_threads.py) lands only on the states its build read, else is rebuilt.
    "Sr": ("agentcas/record_threads.py", ["                    if view.thread(name) != state:\n"],
           ["                    if False:\n"],
           ["tests/test_openai_agents_session.py::"
            "test_a_pop_rebuilds_when_an_add_lands_between_its_read_and_its_landing"]),
    # A session change whose caller is cancelled finishes in the store before the cancel is raised.
    "Sc": ("agentcas/record_threads.py", ["            await asyncio.shield(future)\n"],
           ["            await future\n"],
           ["tests/test_openai_agents_session.py::test_a_cancelled_add_lands_whole_before_the_cancel_is_raised"]),
}


def _edit(path: str, olds, news) -> tuple[str, str] | None:
    """(original, mutated) text of `path`, or None if a site is not there exactly once."""
    with open(os.path.join(ROOT, path)) as handle:
        original = handle.read()
    mutated = original
    for old, new in zip(olds, news):
        if mutated.count(old) != 1:
            return None
        mutated = mutated.replace(old, new)
    return original, mutated


def run(name: str) -> str:
    path, olds, news, tests, *more = MUTATIONS[name]
    edits = [(path, olds, news)] + [tuple(extra) for extra in more]
    planned = []
    for file, o, n in edits:
        texts = _edit(file, o, n)
        if texts is None:
            return f"{name}: MOVED (site not found in {file})"
        planned.append((file, *texts))
    try:
        for file, _, mutated in planned:
            with open(os.path.join(ROOT, file), "w") as handle:
                handle.write(mutated)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        for file, original, _ in planned:
            with open(os.path.join(ROOT, file), "w") as handle:
                handle.write(original)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    verdict = "CAUGHT" if proc.returncode != 0 else "MISSED"
    return f"{name}: {verdict}" + "".join(f"\n    {line}" for line in failed)


if __name__ == "__main__":
    names = sys.argv[1:] or list(MUTATIONS)
    results = [run(name) for name in names]
    print("\n".join(results))
    sys.exit(0 if all(": CAUGHT" in r for r in results) else 1)
