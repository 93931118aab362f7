"""Writes tests/data/langgraph_layout1.bundle with agentcas at 32f8463 (saver layout 1)."""
import json, os, shutil, subprocess, sys
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from agentcas.langgraph import AgentcasSaver
import agentcas.langgraph.saver as S
assert not hasattr(S, "_checkpoint_record")
work = "/tmp/lgp/gen"; shutil.rmtree(work, ignore_errors=True); os.makedirs(work)
store = f"{work}/store"

class State(MessagesState):
    notes: str

def agent(state):
    return {"messages": [AIMessage(content=f"reply {len(state['messages'])}", id=f"r{len(state['messages'])}")],
            "notes": "n" * 5000 + str(len(state["messages"]))}

b = StateGraph(State); b.add_node("agent", agent); b.add_edge(START, "agent"); b.add_edge("agent", END)
with AgentcasSaver.from_path(store) as saver:
    g = b.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "old"}}
    for i in range(3):
        g.invoke({"messages": [HumanMessage(content=f"question {i}", id=f"q{i}")]}, cfg)
    head = g.get_state(cfg).config

env = dict(os.environ, AGENTCAS_STORE=store)
subprocess.run([sys.executable, "-m", "agentcas", "export", "langgraph/old", "-o", f"{work}/old.bundle"], check=True, env=env)
shutil.copy(f"{work}/old.bundle", sys.argv[1])
print(os.path.getsize(sys.argv[1]))
