#!/usr/bin/python3
"""plot_test (tests/integration/ops.cmake): RunLog writes a run.jsonl (through the
l2l_ops_runlog_writer helper), scripts/plot_run.py turns it into a PNG, and this checks
the PNG is real: the PNG signature, an IHDR chunk whose size matches plot_run.py's
figure (16 x 4.5 in at 100 dpi), a file size plausible for three drawn panels, and the
final IEND chunk; the validation points (val_loss, val_ppl = exp(val_loss)) reach
the log and plot_run.py reports them. Also: plot_run.py refuses a broken log with a message naming path:line.

Usage: plot_test.py RUNLOG_WRITER PLOT_RUN_PY
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def fail(msg):
    sys.exit("plot_test: FAIL: " + msg)


def main():
    writer, plot = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="l2l-plot-") as d:
        steps = 40
        out = subprocess.run([writer, d, str(steps)], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"runlog writer exited {out.returncode}: {out.stderr}")
        log = os.path.join(d, "run.jsonl")
        rows = [json.loads(l) for l in open(log)]
        if [r["step"] for r in rows] != list(range(1, steps + 1)):
            fail(f"run.jsonl steps are {[r['step'] for r in rows]}")
        for k in ("loss", "tokens_per_s", "forward_s", "recompute_s", "backward_s",
                  "wait_layer_s", "wait_push_s", "update_s", "time", "lr"):
            if k not in rows[0]:
                fail(f"run.jsonl has no '{k}' field: {rows[0]}")

        val = [(r["step"], r["val_loss"], r["val_ppl"]) for r in rows if "val_loss" in r]
        if [v[0] for v in val] != [10, 20, 30, 40]:
            fail(f"run.jsonl val_loss steps are {[v[0] for v in val]}, expected 10, 20, 30, 40")
        for s_, v, ppl in val:
            if abs(ppl - math.exp(v)) > 1e-9 * ppl:
                fail(f"step {s_}: val_ppl {ppl} is not exp(val_loss {v})")

        png = os.path.join(d, "run.png")
        res = subprocess.run([sys.executable, plot, log, png], capture_output=True, text=True)
        if res.returncode != 0:
            fail(f"plot_run.py exited {res.returncode}: {res.stdout}{res.stderr}")
        want = f"({steps} steps, val_loss {val[0][1]:.4f} at step 10 -> {val[-1][1]:.4f} at step 40)"
        if want not in res.stdout:
            fail(f"plot_run.py said: {res.stdout!r}")
        data = open(png, "rb").read()
        if data[:8] != b"\x89PNG\r\n\x1a\n":
            fail("not a PNG signature")
        length, ctype = struct.unpack(">I4s", data[8:16])
        if ctype != b"IHDR" or length != 13:
            fail(f"first chunk is {ctype!r} ({length} bytes), not IHDR")
        width, height = struct.unpack(">II", data[16:24])
        if (width, height) != (1600, 450):
            fail(f"PNG is {width}x{height}, plot_run.py draws 1600x450")
        if not data.endswith(b"IEND\xaeB`\x82"):
            fail("PNG does not end with IEND (truncated?)")
        # A blank 1600x450 canvas compresses to ~5 KB; three panels with text, lines and
        # bars are several times that.
        if not 20_000 <= len(data) <= 5_000_000:
            fail(f"implausible PNG size {len(data)} bytes")

        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 1, "loss": 2.0}\nnot json\n')
        res = subprocess.run([sys.executable, plot, bad, os.path.join(d, "bad.png")],
                             capture_output=True, text=True)
        if res.returncode == 0 or f"{bad}:2" not in res.stderr:
            fail(f"broken log: exit {res.returncode}, stderr {res.stderr!r}")
        print(f"plot_test: OK ({len(data)} byte PNG, {width}x{height}, {steps} steps)")


if __name__ == "__main__":
    main()
