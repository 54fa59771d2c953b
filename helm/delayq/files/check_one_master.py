"""helm test: `delayq status --json` must show exactly one master per shard (retried: elections take seconds)."""

import json
import subprocess
import sys
import time


def problem_with(status):
    nodes = status.get("nodes") or []
    if isinstance(nodes, dict):
        nodes = list(nodes.values())
    shards = status.get("shards")
    if not shards:  # a delayq from before shards: one master for the cluster
        masters = [node.get("node_id") for node in nodes if node.get("role") == "master"]
        if status.get("master") is None:
            return f"no master (nodes: {[node.get('node_id') for node in nodes]})"
        if len(masters) != 1:
            return f"{len(masters)} nodes have role master: {masters}"
        return None
    for shard in shards:
        k = shard.get("shard")
        claiming = [node.get("node_id") for node in nodes if k in (node.get("masters") or [])]
        if shard.get("master") is None:
            return f"shard {k} has no master (nodes: {[node.get('node_id') for node in nodes]})"
        if len(claiming) != 1:
            return f"shard {k}: {len(claiming)} nodes say they are its master: {claiming}"
    return None


def summary(status):
    shards = status.get("shards")
    if not shards:
        return f"one master: {status['master']}"
    return "one master per shard: " + ", ".join(f"{s['shard']} {s['master']}" for s in shards)


def main(timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        run = subprocess.run(["delayq", "status", "--json"], capture_output=True, text=True)
        if run.returncode != 0:
            problem = f"delayq status --json exited {run.returncode}: {run.stderr.strip()}"
        else:
            status = json.loads(run.stdout)
            problem = problem_with(status)
            if problem is None:
                print(f"{summary(status)}; {len(status.get('nodes') or [])} live nodes")
                return 0
        if time.monotonic() >= deadline:
            print(f"FAILED after {timeout_s:g} s: {problem}", file=sys.stderr)
            return 1
        print(f"waiting: {problem}", flush=True)
        time.sleep(3)


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 120.0))
