#!/usr/bin/env python3
"""bench/peers/supervise.py leaves one JSON line for every way a peer run can end, and summarize.py shows a
failed run with its reason. The children are small Python programs standing in for a peer: they print phase
lines, then print a result, overrun, exit with an error, or are killed with SIGKILL as the OOM killer does."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SUPERVISE = os.path.join(ROOT, "bench", "peers", "supervise.py")
BASE = {"bench": "peer", "peer": "fsdp2", "shape": "llama-8b", "batch": 8}


def supervise(child_code, deadline=0):
    args = [sys.executable, SUPERVISE, "--line", json.dumps(BASE)]
    if deadline:
        args += ["--deadline", str(deadline)]
    args += ["--", sys.executable, "-c", child_code]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    return p.returncode, lines


PHASE = "import json, os, signal, sys, time\ndef phase(n): print(json.dumps({'phase': n}), flush=True)\n"


class PeerSupervisor(unittest.TestCase):
    def test_result_line_passes_through_and_phase_lines_do_not(self):
        rc, lines = supervise(PHASE + "phase('setup'); print(json.dumps({'bench': 'peer', 'tokens_per_s': 5.0}))")
        self.assertEqual(rc, 0)
        self.assertEqual(lines, [{"bench": "peer", "tokens_per_s": 5.0}])

    def test_deadline_stops_the_group_and_names_the_phase(self):
        rc, lines = supervise(PHASE + "phase('warm-up'); time.sleep(30)", deadline=1)
        self.assertEqual(rc, 124)
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["error"], "timed out after 1 s in phase warm-up")
        self.assertEqual(lines[0]["peer"], "fsdp2")
        self.assertLess(lines[0]["seconds"], 20)

    def test_sigkill_reports_the_signal_the_phase_and_the_memory_reached(self):
        # 300 MB touched, then the end the OOM killer gives: SIGKILL, no chance to print.
        rc, lines = supervise(PHASE + "phase('setup'); b = bytearray(300 << 20)\n"
                              "for i in range(0, len(b), 4096): b[i] = 1\n"
                              "time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual(rc, 137)
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0]["error"].startswith("killed by SIGKILL after "), lines[0]["error"])
        self.assertIn("in phase setup", lines[0]["error"])
        self.assertEqual(lines[0]["phase"], "setup")
        self.assertGreater(lines[0]["peak_host_rss_bytes"], 300 << 20)
        self.assertGreater(lines[0]["min_host_mem_available_bytes"], 0)

    def test_exit_without_a_result_line(self):
        rc, lines = supervise(PHASE + "phase('steps'); sys.exit(3)")
        self.assertEqual(rc, 3)
        self.assertEqual(lines[0]["error"], "exited with status 3 after 0 s in phase steps")

    def test_a_failure_after_the_result_keeps_both_lines(self):
        rc, lines = supervise(PHASE + "print(json.dumps({'bench': 'peer', 'tokens_per_s': 1.0})); sys.exit(2)")
        self.assertEqual(rc, 2)
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[1]["error"].startswith("after its result line: exited with status 2"))

    def test_summary_shows_a_failed_peer_with_its_reason_and_host_peak(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
        import summarize

        rows = [{"commit": "c1", "bench": "sliding", "shape": "llama-8b", "batch": 8, "tokens_per_s": 3600.0,
                 "peak_gpu_bytes": 20 << 30, "peak_host_rss_bytes": 110 << 30, "bounded_by": "cpu_update"},
                dict(BASE, commit="c1", error="killed by SIGKILL after 143 s in phase setup (host memory "
                     "available fell to 0.4 GiB, the kernel's OOM killer)", peak_host_rss_bytes=120 << 30)]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
        try:
            commit, table = summarize.load(f.name)
        finally:
            os.unlink(f.name)
        md = summarize.markdown(commit, table)
        self.assertIn("failed: killed by SIGKILL after 143 s in phase setup (host memory available fell to 0.4 "
                      "GiB, the kernel's OOM killer)", md)
        self.assertIn("- / 120.0", md)

    def test_ladder_lists_each_systems_runs_by_size_and_the_main_table_leaves_them_out(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
        import summarize

        rows = [{"commit": "c2", "bench": "sliding", "shape": "llama-8b", "batch": 8, "tokens_per_s": 3600.0},
                {"commit": "c2", "bench": "sliding", "shape": "llama-8b@34", "batch": 8, "tokens_per_s": 3300.0,
                 "params": 8.47e9, "nvme_state": "none", "peak_host_rss_bytes": 120 << 30},
                {"commit": "c2", "bench": "sliding", "shape": "llama-8b@50", "batch": 8, "tokens_per_s": 410.0,
                 "params": 11.96e9, "nvme_state": "moments_and_master", "nvme_layers": 21,
                 "nvme": {"disk_bytes": 55e9}, "peak_host_rss_bytes": 119 << 30},
                dict(BASE, commit="c1", error="killed by SIGKILL after 143 s in phase warm-up",
                     peak_host_rss_bytes=121 << 30),
                {"commit": "c2", "bench": "peer", "peer": "deepspeed", "shape": "llama-3b", "batch": 8,
                 "tokens_per_s": 2500.0}]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
        try:
            commit, table = summarize.load(f.name)
            md = summarize.markdown(commit, table, f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(commit, "c2")
        self.assertEqual(sorted(table), [("llama-3b", 8), ("llama-8b", 8)])  # no ladder run in the main table
        ladder = md.split("The largest-model ladder")[1]
        self.assertIn("| slideformer | llama-8b@34 | 8.47B | 8 | 3,300 tokens/s | 120.0 GiB | 0.0 GB | c2 |", ladder)
        self.assertIn("| slideformer + NVMe tier (moments_and_master, last 21 layers) | llama-8b@50 | 11.96B | 8 | "
                      "410 tokens/s | 119.0 GiB | 55.0 GB | c2 |", ladder)
        # A failed peer has no parameter count of its own: it comes from the shape (8.03B for llama-8b).
        self.assertIn("| FSDP2 CPU offload | llama-8b | 8.03B | 8 | failed: killed by SIGKILL after 143 s in phase "
                      "warm-up | 121.0 GiB | 0.0 GB | c1 |", ladder)
        self.assertNotIn("llama-3b", ladder)


if __name__ == "__main__":
    unittest.main()
