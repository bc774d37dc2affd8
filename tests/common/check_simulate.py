#!/usr/bin/python3
"""Checks `l2l-bench-relay --simulate` (the analytic multi-device relay model) by its
properties, not by hard-coded numbers:

  check_simulate.py BIN       BIN = l2l-bench-relay

 * every configuration (2 models x 1/2/4/8 devices x bandwidth-centric on/off x
   interleave on/off) is printed once, with a positive finite step time;
 * with bandwidth-centric fetch, more devices are never slower (per model, with and
   without the interleaved optimizer) where the NVLink collectives do not bind -- the
   H100 preset with NVLink4's 450 GB/s and the DGX-2 preset; at the seed's measured 133
   GB/s the model itself says 8 devices all-gather slower than 4 for GPT-2 XL, so there
   the check is only: never slower than every device fetching whole layers; one device
   is the same with or without it;
 * bandwidth-centric fetch delivers more bandwidth than per-device fetch for N > 1;
 * the interleaved optimizer chosen by the model is never slower than no interleave,
   and at --gpu-fraction 0 its step equals the no-interleave step exactly;
 * the table says it is a model, and bad flags exit non-zero.
Both hardware presets (h100, dgx2) are checked. Exits non-zero on the first failure.
"""
import json
import math
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(binary, *args):
    p = subprocess.run([binary, "--simulate", *args], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail("%s exited %d: %s" % (" ".join(args), p.returncode, p.stderr))
    if "MODEL, not a measurement" not in p.stdout:
        fail("the table does not say it is a model")
    rows = {}
    for line in p.stdout.splitlines():
        if line.startswith("json: "):
            j = json.loads(line[len("json: "):])
            key = (j["model"], j["devices"], j["bandwidth_centric"], j["interleave"])
            if key in rows:
                fail("configuration printed twice: %r" % (key,))
            if not (j["step_s"] > 0 and math.isfinite(j["step_s"])):
                fail("bad step time for %r: %r" % (key, j["step_s"]))
            rows[key] = j
    return rows


def check(binary, hw, extra, monotone):
    rows = run(binary, "--hw", hw, *extra)
    models = sorted({k[0] for k in rows})
    if models != ["gpt2-xl", "llama-7b"]:
        fail("models printed: %r" % models)
    if len(rows) != 2 * 4 * 2 * 2:
        fail("%d configurations printed, expected 32" % len(rows))
    for m in models:
        for il in (False, True):
            prev = None
            for n in (1, 2, 4, 8):
                t = rows[(m, n, True, il)]["step_s"]
                if t > rows[(m, n, False, il)]["step_s"] * (1 + 1e-12):
                    fail("%s %s N=%d: bandwidth-centric fetch slower than per-device fetch" % (hw, m, n))
                if monotone and prev is not None and t > prev * (1 + 1e-12):
                    fail("%s %s: %d devices with bandwidth-centric fetch slower (%g s) than fewer (%g s)"
                         % (hw, m, n, t, prev))
                prev = t
            if rows[(m, 1, True, il)]["step_s"] != rows[(m, 1, False, il)]["step_s"]:
                fail("%s %s: one device differs with bandwidth-centric fetch" % (hw, m))
        for n in (2, 4, 8):
            if not rows[(m, n, True, False)]["fetch_gbps"] > rows[(m, n, False, False)]["fetch_gbps"]:
                fail("%s %s N=%d: bandwidth-centric fetch delivers no more bandwidth" % (hw, m, n))
        for n in (1, 2, 4, 8):
            for bwc in (False, True):
                if rows[(m, n, bwc, True)]["step_s"] > rows[(m, n, bwc, False)]["step_s"] * (1 + 1e-12):
                    fail("%s %s N=%d: the chosen interleave is slower than none" % (hw, m, n))
    zero = run(binary, "--hw", hw, *extra, "--gpu-fraction", "0")
    for (m, n, bwc, il), j in zero.items():
        if il:
            base = zero[(m, n, bwc, False)]
            if j["step_s"] != base["step_s"] or j["gpu_fraction"] != 0:
                fail("%s %s N=%d bwc=%s: fraction 0 differs from no interleave (%r vs %r)"
                     % (hw, m, n, bwc, j["step_s"], base["step_s"]))


def main():
    binary = sys.argv[1]
    check(binary, "h100", ["--nvlink-gbps", "450"], monotone=True)
    check(binary, "dgx2", [], monotone=True)
    check(binary, "h100", [], monotone=False)
    for bad in (["--hw", "tpu"], ["--gpu-fraction", "1.5"], ["--devices", "0"]):
        p = subprocess.run([binary, "--simulate", *bad], capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            fail("--simulate %s succeeded" % " ".join(bad))
    print("ok")


if __name__ == "__main__":
    main()
