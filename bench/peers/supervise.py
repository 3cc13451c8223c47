#!/usr/bin/env python3
"""Runs one benchmark process and makes sure it leaves a JSON line, whatever becomes of it.

  supervise.py [--deadline SECONDS] [--line JSON] -- COMMAND...

COMMAND's stdout passes through, except lines {"phase": NAME}, which only tell where it is (setup, warm-up,
steps). When COMMAND ends without having printed a result line (a JSON object with "bench"), because it was
killed (the kernel's OOM killer sends SIGKILL and nothing else gets to run), overran the deadline or exited
with an error, this prints one in its place: the --line fields plus "error", the phase it was in, how long it
ran, the peak host memory of its process group and the least host memory available meanwhile, so a peer that
cannot run a shape on the box says why instead of leaving no trace.

Exit status: COMMAND's (0 when it printed a result line and exited 0), 124 after the deadline.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

POLL_S = 0.2


def meminfo_bytes(field):
    """A /proc/meminfo field (MemAvailable, MemTotal) in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def group_rss_bytes(pgid):
    """Resident memory of every process in the group (the peer and whatever it started: compilers, workers)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the command name: state, ppid, pgrp, ...
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue  # the process ended between listing and reading
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deadline", type=float, default=0, help="seconds before the process group is stopped")
    parser.add_argument("--line", default="{}", help="JSON fields the failure line starts with")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    base = json.loads(args.line)

    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
    state = {"phase": "start", "result": False}

    def relay():
        for line in child.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and set(obj) == {"phase"}:
                state["phase"] = str(obj["phase"])
                continue
            if isinstance(obj, dict) and "bench" in obj:
                state["result"] = True
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    peak_rss, min_avail, timed_out = 0, meminfo_bytes("MemAvailable"), False
    while child.poll() is None:
        peak_rss = max(peak_rss, group_rss_bytes(child.pid))
        min_avail = min(min_avail, meminfo_bytes("MemAvailable"))
        if args.deadline > 0 and time.monotonic() - start > args.deadline and not timed_out:
            timed_out = True
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        time.sleep(POLL_S)
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what it started and left behind
    except ProcessLookupError:
        pass
    reader.join(5)
    secs = time.monotonic() - start
    rc = child.returncode
    if state["result"] and rc == 0:
        return 0

    phase = state["phase"]
    if timed_out:
        error = f"timed out after {args.deadline:g} s in phase {phase}"
    elif rc < 0:
        name = signal.Signals(-rc).name
        error = f"killed by {name} after {secs:.0f} s in phase {phase}"
        if -rc == signal.SIGKILL and min_avail < 0.05 * meminfo_bytes("MemTotal"):
            error += f" (host memory available fell to {min_avail / 2**30:.1f} GiB, the kernel's OOM killer)"
    else:
        error = f"exited with status {rc} after {secs:.0f} s in phase {phase}"
    if state["result"]:  # it said something, then failed: keep its line, add ours
        error = "after its result line: " + error
    out = dict(base)
    out.update({"error": error, "phase": phase, "seconds": round(secs, 1), "peak_host_rss_bytes": peak_rss,
                "min_host_mem_available_bytes": min_avail})
    print(json.dumps(out), flush=True)
    return 124 if timed_out else (rc if rc > 0 else 128 - rc)


if __name__ == "__main__":
    sys.exit(main())
