"""Builds tests/data/store-v1: a store written by agentcas format 1 (commit 0eb7735)."""
import os, sys, json
from agentcas.repository import Store
out, ws = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(ws, "memory"))
def write(path, data):
    with open(os.path.join(ws, path), "w") as f:
        f.write(data)
os.environ["AGENTCAS_AUTHOR"] = "v1@example"
store, _ = Store.init(out)
write("memory/notes.md", "plan: sum of squares\n")
write("task.json", '{"step": 1}\n')
with open(os.path.join(ws, "big.bin"), "wb") as f:  # a multi-chunk file (chunk list)
    f.write(bytes(range(256)) * 4096 + b"tail" * 100000)
rollout = os.path.join(ws, "rollout.jsonl")
with open(rollout, "w") as f:
    for i in range(3):
        f.write(json.dumps({"role": "user", "i": i}) + "\n")
store.checkpoints.commit(ws, "first", rollout_file=rollout)
write("task.json", '{"step": 2}\n')
with open(rollout, "a") as f:
    f.write(json.dumps({"role": "assistant", "text": "x" * 200000}) + "\n")  # a chunked segment
store.checkpoints.commit(ws, "second", rollout_file=rollout)
store.history.append("main", b'{"role":"tool","i":5}\n')
store.threads.fork("main", "explore", at=2)
store.history.append("explore", b'{"role":"user","alt":1}\n')
store.threads.create("old", "main~1")
store.threads.revert("main", "main~1")
print(json.dumps({t["thread"]: t["checkpoint"] for t in [item.to_json() for item in store.threads.list()]}))
