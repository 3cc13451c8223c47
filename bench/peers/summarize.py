#!/usr/bin/env python3
"""Ours against the peers from one run's JSON lines (sliding_bench "sliding" lines and peer_train.py "peer" lines).

  summarize.py RESULTS.jsonl [OUT_PREFIX]

Writes OUT_PREFIX.md (tokens/s per shape and batch, and ours / each peer; then the largest-model ladder: every run
at another depth (SHAPE@LAYERS) or with the NVMe tier, and every offloading peer's failure, by size) and OUT_PREFIX.svg
(tokens/s by model size, one line per system). Only lines of the same commit as the newest "sliding" line are
compared: a ratio counts only between runs of the same call on the same box. Ours is the first run of each shape
and batch in the call (run_gpu.sh runs the defaults first, then variants such as another streamed share).
"""
import json
import sys
from collections import defaultdict

from shapes import params

SYSTEMS = ["ours", "plain", "fwdbwd", "fsdp2", "deepspeed"]
LABELS = {"ours": "slideformer", "plain": "PyTorch+HF on GPU", "fwdbwd": "PyTorch+HF fwd+bwd only",
          "fsdp2": "FSDP2 CPU offload", "deepspeed": "DeepSpeed ZeRO-3 offload"}


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def in_ladder(r):
    """A run of the largest-model ladder: another depth, the NVMe tier, or an offloading peer that failed."""
    return "@" in r.get("shape", "") or r.get("nvme_state", "none") != "none" or (
        r.get("bench") == "peer" and r.get("peer") in ("fsdp2", "deepspeed") and "error" in r)


def load(path):
    rows = read_rows(path)
    ours = [r for r in rows if r.get("bench") == "sliding" and not in_ladder(r)]
    commit = ours[-1].get("commit") if ours else None
    table = defaultdict(dict)  # (shape, batch) -> system -> row
    for r in rows:
        if r.get("commit") != commit or ("@" in r.get("shape", "") or r.get("nvme_state", "none") != "none"):
            continue
        if r.get("bench") == "sliding":  # the first run of a shape and batch: later ones are variants of it
            table[(r["shape"], r["batch"])].setdefault("ours", r)
        elif r.get("bench") == "peer":
            table[(r["shape"], r["batch"])][r["peer"]] = r
    return commit, table


def ladder(path):
    """Markdown rows of the largest-model ladder, by system and size (every commit: the runs take several calls)."""
    runs = []
    for r in read_rows(path):
        if r.get("bench") not in ("sliding", "peer") or not in_ladder(r):
            continue
        tier = r.get("nvme_state", "none")
        if r.get("bench") == "peer":
            system = LABELS.get(r["peer"], r["peer"])
        elif tier == "none":
            system = "slideformer"
        else:
            layers = r.get("nvme_layers", -1)
            system = f"slideformer + NVMe tier ({tier}" + (f", last {layers} layers)" if layers > 0 else ")")
        disk = r.get("nvme", {}).get("disk_bytes", 0)
        result = ("failed: " + r["error"]) if "error" in r else f"{r['tokens_per_s']:,.0f} tokens/s"
        runs.append((system, r.get("params") or params(r["shape"]), r["shape"], r.get("batch"),
                     r.get("peak_host_rss_bytes", 0), disk, result, r.get("commit", "?")))
    out = ["| system | shape | parameters | batch | result | peak host RSS | on disk | commit |",
           "|---|---|---|---|---|---|---|---|"]
    for system, n, shape, batch, rss, disk, result, commit in sorted(runs):
        out.append(f"| {system} | {shape} | {n / 1e9:.2f}B | {batch} | {result} | {rss / 2**30:.1f} GiB | "
                   f"{disk / 1e9:.1f} GB | {commit} |")
    return out


def cell(row):
    if row is None:
        return "no result"
    if "error" in row:
        return "failed: " + row["error"].split(":")[0]
    return f"{row['tokens_per_s']:,.0f}"


def markdown(commit, table, path=None):
    hardware = next((r.get("hardware") for by in table.values() for r in by.values() if r.get("hardware")), "?")
    out = [f"Tokens/s on {hardware} (commit {commit}; seq 1024; ours with a 24 GiB GPU budget).", "",
           "| shape | batch | " + " | ".join(LABELS[s] for s in SYSTEMS) + " | ours / " +
           " | ours / ".join(LABELS[s] for s in SYSTEMS[1:]) + " |",
           "|" + "---|" * (2 + 2 * len(SYSTEMS) - 1)]
    for (shape, batch), by in sorted(table.items()):
        ours = by.get("ours")
        ratios = []
        for s in SYSTEMS[1:]:
            p = by.get(s)
            ok = ours and p and "error" not in p and "error" not in ours
            ratios.append(f"{ours['tokens_per_s'] / p['tokens_per_s']:.2f}x" if ok else "-")
        out.append(f"| {shape} | {batch} | " + " | ".join(cell(by.get(s)) for s in SYSTEMS) + " | " +
                   " | ".join(ratios) + " |")
    # Ours at a batch PyTorch + HF forward+backward did not run (it does not fit: the critical batch) against that
    # ceiling at its largest batch in the call.
    for shape in sorted({shape for shape, _ in table}):
        ceiling = [(b, by["fwdbwd"]) for (s, b), by in table.items()
                   if s == shape and "fwdbwd" in by and "error" not in by["fwdbwd"]]
        if not ceiling:
            continue
        fb_batch, fb = max(ceiling, key=lambda c: c[0])
        for (s, b), by in sorted(table.items()):
            ours = by.get("ours")
            if s == shape and "fwdbwd" not in by and ours and "error" not in ours:
                out.append(f"\n{shape}: ours at batch {b} / PyTorch+HF fwd+bwd only at batch {fb_batch} (its largest in "
                           f"this call): {ours['tokens_per_s']:,.0f} / {fb['tokens_per_s']:,.0f} = "
                           f"{ours['tokens_per_s'] / fb['tokens_per_s']:.2f}x")
    out += ["", "Peak GPU memory / peak host RSS (GiB), and what bounded our step:", "",
            "| shape | batch | " + " | ".join(LABELS[s] for s in SYSTEMS) + " | ours bounded by | ours overlap |",
            "|" + "---|" * (2 + len(SYSTEMS) + 2)]
    for (shape, batch), by in sorted(table.items()):
        gib = [(f"{by[s]['peak_gpu_bytes'] / 2**30:.1f}" if by[s].get("peak_gpu_bytes") else "-") +
               f" / {by[s].get('peak_host_rss_bytes', 0) / 2**30:.1f}"  # a failed run: its host peak till then
               if s in by and (by[s].get("peak_gpu_bytes") or by[s].get("peak_host_rss_bytes")) else "-"
               for s in SYSTEMS]
        ours = by.get("ours", {})
        out.append(f"| {shape} | {batch} | " + " | ".join(gib) +
                   f" | {ours.get('bounded_by', '-')} | {ours.get('overlap_ratio', '-')} |")
    rows = ladder(path) if path else []
    if len(rows) > 2:
        out += ["", "The largest-model ladder (the box: 125 GiB of host memory, 64 GiB of disk):", ""] + rows
    return "\n".join(out) + "\n"


def svg(table):
    sizes = {"llama-1b": 1.24, "llama-3b": 3.21, "llama-8b": 8.03}
    points = defaultdict(list)
    for (shape, batch), by in table.items():
        for s, r in by.items():
            if "error" not in r and shape in sizes:
                points[s].append((sizes[shape], r["tokens_per_s"]))
    top = max([y for pts in points.values() for _, y in pts] + [1])
    w, h, m = 640, 400, 60
    x = lambda v: m + (v - 0) / 9.0 * (w - 2 * m)
    y = lambda v: h - m - v / (top * 1.1) * (h - 2 * m)
    colors = {"ours": "#d62728", "plain": "#1f77b4", "fwdbwd": "#17becf", "fsdp2": "#2ca02c", "deepspeed": "#9467bd"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">parameters (billions)</text>',
             f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">tokens/s</text>']
    for v in (1, 3, 8):
        parts.append(f'<text x="{x(v)}" y="{h - m + 15}" text-anchor="middle">{v}</text>')
    for frac in (0.25, 0.5, 0.75, 1.0):
        v = top * frac
        parts.append(f'<text x="{m - 5}" y="{y(v) + 4}" text-anchor="end">{v:,.0f}</text>')
    for i, (s, pts) in enumerate(sorted(points.items())):
        pts.sort()
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colors.get(s, "gray")}" stroke-width="2"/>')
        for a, b in pts:
            parts.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{colors.get(s, "gray")}"/>')
        parts.append(f'<text x="{w - m - 170}" y="{m + 15 * i}" fill="{colors.get(s, "gray")}">{LABELS.get(s, s)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    commit, table = load(sys.argv[1])
    prefix = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit(".", 1)[0]
    md = markdown(commit, table, sys.argv[1])
    with open(prefix + ".md", "w") as f:
        f.write(md)
    with open(prefix + ".svg", "w") as f:
        f.write(svg(table))
    print(md)


if __name__ == "__main__":
    main()
