#!/usr/bin/env python3
"""Summarises a sliding_bench step trace (SLIDE_TRACE_OUT, Chrome trace JSON): per-layer device times for the
forward and the recompute+backward, the head, device idle time and where it sat, and the update lane's span.
Usage: trace_summary.py TRACE.json [LAYERS]  -> one JSON line on stdout."""
import json
import statistics
import sys


def main():
    trace = json.load(open(sys.argv[1]))["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in trace if e.get("ph") == "M"}
    spans = {}
    for e in trace:
        if e.get("ph") == "X":
            spans.setdefault(lanes[e["tid"]], []).append((e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["name"]))
    for v in spans.values():
        v.sort()
    compute = spans.get("gpu.compute", [])
    out = {"compute_segments": len(compute)}
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else (len(compute) - 3) // 2
    if len(compute) >= 2 * layers + 3:
        # embedding, L layer forwards, head (fwd+bwd), L recompute+backwards, embedding backward
        fwd = [b - a for a, b, _ in compute[1:1 + layers]]
        bwd = [b - a for a, b, _ in compute[2 + layers:2 + 2 * layers]]
        out.update(layer_forward_ms_median=statistics.median(fwd), layer_backward_ms_median=statistics.median(bwd),
                   head_ms=compute[1 + layers][1] - compute[1 + layers][0],
                   forward_wall_ms=compute[layers][1] - compute[1][0],
                   backward_wall_ms=compute[1 + 2 * layers][1] - compute[2 + layers][0])
    if compute:
        busy = sum(b - a for a, b, _ in compute)
        gaps = [(compute[i + 1][0] - compute[i][1], i) for i in range(len(compute) - 1)]
        out.update(device_span_ms=compute[-1][1] - compute[0][0], compute_busy_ms=busy,
                   idle_between_segments_ms=sum(g for g, _ in gaps),
                   largest_gaps_ms=[[round(g, 2), i] for g, i in sorted(gaps, reverse=True)[:5]])
    upd = spans.get("update", [])
    if upd:
        out.update(update_tasks=len(upd), update_busy_ms=sum(b - a for a, b, _ in upd),
                   update_first_start_ms=upd[0][0], update_last_end_ms=upd[-1][1],
                   first_compute_start_ms=compute[0][0] if compute else None)
    waits = spans.get("engine.wait", [])
    out.update(engine_wait_ms=sum(b - a for a, b, _ in waits),
               longest_waits=[[round(b - a, 2), n] for a, b, n in sorted(waits, key=lambda w: w[0] - w[1])[:5]])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
