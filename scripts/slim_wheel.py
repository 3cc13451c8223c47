#!/usr/bin/env python3
"""Rewrites a wheel without the members whose names match any of the given regular expressions, and drops them from
its RECORD. Used to carry bitsandbytes to the GPU box: its wheel holds one 20-26 MB library per CUDA release and per
ROCm release, and the box needs only the one its torch was built for (the device tool carries 64 MiB in all).

usage: slim_wheel.py WHEEL PATTERN...   (the wheel is replaced in place)
"""
import os
import re
import sys
import tempfile
import zipfile


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, patterns = sys.argv[1], [re.compile(p) for p in sys.argv[2:]]
    drop = lambda name: any(p.search(name) for p in patterns)
    fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(os.path.abspath(wheel)))
    os.close(fd)
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if drop(info.filename):
                dropped += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(l for l in lines if not drop(l.split(",", 1)[0])).encode()
            dst.writestr(info, data)
    os.replace(tmp, wheel)
    print(f"{wheel}: {dropped} members dropped, {os.path.getsize(wheel) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
