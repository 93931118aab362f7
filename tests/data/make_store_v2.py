"""Builds tests/data/store-v2: a store written by agentcas format 2 (the last release before
packed objects): commits (one with a multi-chunk file and a chunked rollout record), an append,
a fork, a branch, a revert and a second thread with a few dozen small commits.

    python tests/data/make_store_v2.py OUT_DIR WORKSPACE_DIR  (then tar czf store-v2.tar.gz v2store)
"""
import json
import os
import sys

from agentcas.repository import Store

out, ws = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(ws, "memory"))


def write(path, data):
    with open(os.path.join(ws, path), "w") as f:
        f.write(data)


os.environ["AGENTCAS_AUTHOR"] = "v2@example"
store, _ = Store.init(out)
write("memory/notes.md", "plan: sum of squares\n")
write("task.json", '{"step": 1}\n')
with open(os.path.join(ws, "big.bin"), "wb") as f:  # a multi-chunk file (chunk list)
    f.write(bytes(range(256)) * 4096 + b"tail" * 100000)
rollout = os.path.join(ws, "rollout.jsonl")
with open(rollout, "w") as f:
    for i in range(3):
        f.write(json.dumps({"role": "user", "i": i}) + "\n")
store.commit(ws, "first", rollout_file=rollout)
write("task.json", '{"step": 2}\n')
with open(rollout, "a") as f:
    f.write(json.dumps({"role": "assistant", "text": "x" * 200000}) + "\n")  # a chunked segment
store.commit(ws, "second", rollout_file=rollout)
store.rollout_append("main", b'{"role":"tool","i":5}\n')
store.fork("main", "explore", at=2)
store.rollout_append("explore", b'{"role":"user","alt":1}\n')
store.create_thread("old", "main~1")
store.revert("main", "main~1")
os.remove(os.path.join(ws, "big.bin"))
for step in range(40):  # many small steps: what packing is for
    write("memory/state.json", json.dumps({"step": step}) + "\n")
    with open(rollout, "a") as f:
        f.write(json.dumps({"role": "user", "step": step, "text": "m" * (step * 7)}) + "\n")
    store.commit(ws, f"step {step}", thread="steps", rollout_file=rollout)
print(json.dumps({t["thread"]: t["checkpoint"] for t in store.threads()}))
