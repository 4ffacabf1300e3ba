"""A long-running process on approval-gate-mcp's file contract, written as the seed's
example code has it: it proposes instead of acting (appending to pending.json), and on
each cycle reads approved.json, acts on every proposal in it, clears it, and appends a
record of each action to records.json. Standard library only, no countersign code.

Each action appends one line (the proposal as JSON) to actions.jsonl, so a test can
count how often each proposal was acted on.

With --lock it follows the optional lock protocol of docs/bridge.md: every
read-modify-write of pending.json and every read-act-clear of approved.json holds an
exclusive flock on bridge.lock in the same folder.

The tests in crates/countersign/tests/it/bridge.rs run it.
"""

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_json(path, value):
    # As the seed's process writes: in place, no temporary file, no lock.
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--jobs", required=True, help="a JSON file: the proposals to make, in order")
    parser.add_argument("--per-cycle", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--lock", action="store_true")
    args = parser.parse_args()

    pending_file = os.path.join(args.dir, "pending.json")
    approved_file = os.path.join(args.dir, "approved.json")
    records_file = os.path.join(args.dir, "records.json")
    actions_file = os.path.join(args.dir, "actions.jsonl")
    stop_file = os.path.join(args.dir, "stop")
    lock_file = os.path.join(args.dir, "bridge.lock")
    with open(args.jobs) as f:
        jobs = json.load(f)

    @contextlib.contextmanager
    def locked():
        if not args.lock:
            yield
            return
        with open(lock_file, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def execute(proposal):
        with open(actions_file, "a") as f:
            f.write(json.dumps(proposal) + "\n")
            f.flush()
            os.fsync(f.fileno())
        records = read_json(records_file) or []
        records.append(
            {
                "id": proposal.get("id"),
                "record_type": proposal.get("action", "job"),
                "resolved": True,
                "outcome": "win",
                "cost": proposal.get("cost"),
            }
        )
        write_json(records_file, records)

    proposed = 0
    while True:
        # The seed's step 3: read approved.json, act on what is there, clear it.
        with locked():
            approved = read_json(approved_file) or {"proposals": []}
            for proposal in approved["proposals"]:
                execute(proposal)
            write_json(approved_file, {"proposals": []})

        # The seed's step 2: propose instead of acting.
        batch = jobs[proposed : proposed + args.per_cycle]
        if batch:
            with locked():
                pending = read_json(pending_file) or {"proposals": []}
                pending["proposals"].extend(batch)
                write_json(pending_file, pending)
            proposed += len(batch)

        if os.path.exists(stop_file):
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
