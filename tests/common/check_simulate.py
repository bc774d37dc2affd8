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
Both hardware presets (h100, dgx2) are checked.
--rates-json (measured rates, as scripts/bench_gpu.sh writes them): on one device the
forward and backward times equal this file's own evaluation of the model's per-layer rule
(each layer costs the slowest of its compute -- matmuls at matmul_tflops plus attention at
attention_tflops -- its weight fetch at h2d_gbps and, in the backward, its gradient push at
d2h_gbps) for GPT-2 XL and Qwen2.5-1.5B, once compute-bound and once link-bound; a
different matmul rate moves the prediction, the file equals the same rates given as flags,
flags override the file, and bad files are errors.
--shards (the scale-out model, common/cluster_model.h), for a 70B Llama whose parameters
this file counts itself: every (link, workers, shards, layout, fetch) configuration once;
the shards together send W copies of the bf16 layers twice per step and receive W fp32
gradients; doubling the shards halves each shard's traffic (contiguous ranges: up to one
layer; stripes: exactly); at 25 Gb/s with 64 workers and 1 shard the shard NIC binds, and
at 1 Pb/s no NIC does; the shards update at the rates file's cpu_update_g;
--shard-overhead-s adds (S - 1) x itself; the single-host table
prints no cluster line; bad flags are errors naming the flag. Exits non-zero on the first
failure.
"""
import json
import math
import os
import subprocess
import sys
import tempfile


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


# The shapes as published (Hugging Face configs), independent of common/relay_model.cc:
# layers, d_model, d_ff, vocab, gated MLP, tied embeddings, key/value width.
SHAPES = {
    "gpt2-xl": (48, 1600, 6400, 50257, False, True, 1600),
    "qwen2.5-1.5b": (28, 1536, 8960, 151936, True, True, 2 * 128),
}


def expected_one_device(name, T, tokens, r):
    """forward_s, backward_s of one device fetching whole layers, from the model's rule."""
    L, d, ff, V, gated, tied, kv = SHAPES[name]
    mm, at = r["matmul_tflops"] * 1e12, r["attention_tflops"] * 1e12
    h2d, d2h, host = r["h2d_gbps"] * 1e9, r["d2h_gbps"] * 1e9, r["host_gbps"] * 1e9
    block = 2 * d * d + 2 * d * kv + (3 if gated else 2) * d * ff
    pos = T * d if tied else 0
    layers = [(0, 0, V * d + pos, max(pos, 1) if tied else V * d)]            # embedding
    layers += [(2 * block, 4 * T * d, block, block)] * L                      # blocks
    layers += [(2 * V * d, 0, V * d, V * d)]                                  # head
    fwd = bwd = 0.0
    for mm_flops, at_flops, fetch_params, update_params in layers:
        compute = mm_flops * tokens / mm + at_flops * tokens / at
        fetch = max(2 * fetch_params / h2d, 2 * fetch_params / host)           # bf16 published
        push = max(4 * update_params / d2h, 4 * update_params / host)          # fp32 gradient
        fwd += max(compute, fetch)
        bwd += max(3 * compute, fetch, push)                                   # recompute + 2x
    return fwd, bwd


def write_json(obj):
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def check_rates(binary):
    T, seqs = 1024, 16
    common = ["--devices", "1", "--sequences", str(seqs), "--seq-len", str(T), "--shapes", "gpt2-xl,qwen2.5-1.5b"]
    cases = {
        "compute-bound": {"matmul_tflops": 640.0, "attention_tflops": 210.0, "h2d_gbps": 5000.0,
                          "d2h_gbps": 4000.0, "host_gbps": 9000.0, "device": "test"},
        "link-bound": {"matmul_tflops": 700.0, "attention_tflops": 350.0, "h2d_gbps": 3.0,
                       "d2h_gbps": 2.0, "host_gbps": 500.0, "device": "test"},
    }
    files = []
    try:
        results = {}
        for label, rates in cases.items():
            path = write_json(rates)
            files.append(path)
            rows = run(binary, "--rates-json", path, *common)
            if sorted({k[0] for k in rows}) != sorted(SHAPES):
                fail("--shapes printed %r" % sorted({k[0] for k in rows}))
            for m in SHAPES:
                j = rows[(m, 1, False, False)]
                fwd, bwd = expected_one_device(m, T, seqs * T, rates)
                for what, got, want in (("forward_s", j["forward_s"], fwd), ("backward_s", j["backward_s"], bwd)):
                    if not abs(got - want) <= 1e-9 * want:
                        fail("%s %s: %s %r, the model's rule gives %r" % (label, m, what, got, want))
                if j["tokens_per_step"] != seqs * T or j["seq_len"] != T:
                    fail("%s %s: tokens_per_step %r seq_len %r" % (label, m, j["tokens_per_step"], j["seq_len"]))
            results[label] = rows
            # The same rates as flags give the same prediction, bit for bit (--pcie-gbps sets
            # both directions; the file sets them apart, so compare a file whose h2d equals d2h).
            same = dict(rates, d2h_gbps=rates["h2d_gbps"])
            p2 = write_json(same)
            files.append(p2)
            flags = run(binary, "--tflops", str(rates["matmul_tflops"]), "--attention-tflops",
                        str(rates["attention_tflops"]), "--host-gbps", str(rates["host_gbps"]),
                        "--pcie-gbps", str(rates["h2d_gbps"]), *common)
            if run(binary, "--rates-json", p2, *common) != flags:
                fail("%s: --rates-json differs from the same rates given as flags" % label)
        # A slower matmul rate moves the compute-bound prediction (and the rule above still holds).
        slow = dict(cases["compute-bound"], matmul_tflops=320.0)
        p3 = write_json(slow)
        files.append(p3)
        rows = run(binary, "--rates-json", p3, *common)
        for m in SHAPES:
            a, b = rows[(m, 1, False, False)]["step_s"], results["compute-bound"][(m, 1, False, False)]["step_s"]
            if not a > b * 1.3:
                fail("%s: halving matmul_tflops moved the compute-bound step only from %r to %r" % (m, b, a))
            fwd, _ = expected_one_device(m, T, seqs * T, slow)
            if not abs(rows[(m, 1, False, False)]["forward_s"] - fwd) <= 1e-9 * fwd:
                fail("%s at 320 TFLOP/s: forward_s differs from the model's rule" % m)
        # Flags override the file.
        rows = run(binary, "--rates-json", p3, "--tflops", "640", *common)
        for m in SHAPES:
            if rows[(m, 1, False, False)]["forward_s"] != results["compute-bound"][(m, 1, False, False)]["forward_s"]:
                fail("%s: --tflops did not override the file's matmul_tflops" % m)
        # attention_tflops absent: the attention runs at the matmul rate.
        p4 = write_json({k: v for k, v in cases["compute-bound"].items() if k != "attention_tflops"})
        files.append(p4)
        rows = run(binary, "--rates-json", p4, *common)
        for m in SHAPES:
            fwd, _ = expected_one_device(m, T, seqs * T, dict(cases["compute-bound"], attention_tflops=640.0))
            if not abs(rows[(m, 1, False, False)]["forward_s"] - fwd) <= 1e-9 * fwd:
                fail("%s: without attention_tflops the attention is not at the matmul rate" % m)
        # Bad files are errors that name the problem.
        for bad, why in (('{"matmul_tflops": "fast"}', "matmul_tflops"), ('{"h2d_gbps": -1}', "h2d_gbps"),
                         ('{"device": "H100"}', "none of the rate keys"), ("[1, 2]", "not a JSON object"),
                         ("{not json", "not valid JSON")):
            pb = write_json(bad)
            files.append(pb)
            p = subprocess.run([binary, "--simulate", "--rates-json", pb], capture_output=True, text=True, timeout=60)
            if p.returncode == 0 or why not in p.stderr:
                fail("--rates-json %s: rc %d, stderr %r (wanted an error naming %r)" % (bad, p.returncode, p.stderr, why))
        p = subprocess.run([binary, "--simulate", "--rates-json", "/nonexistent/rates.json"], capture_output=True,
                           text=True, timeout=60)
        if p.returncode == 0 or "/nonexistent/rates.json" not in p.stderr:
            fail("a missing --rates-json file was not an error naming it")
    finally:
        for path in files:
            os.unlink(path)


# Llama 3 70B (Hugging Face config): layers, d, d_ff, kv width, vocab; untied, gated.
L70, D70, FF70, KV70, V70 = 80, 8192, 28672, 1024, 128256
BLOCK70 = 2 * D70 * D70 + 2 * D70 * KV70 + 3 * D70 * FF70
TABLE70 = V70 * D70
P70 = L70 * BLOCK70 + 2 * TABLE70  # 70,553,706,496 less the norms (1,318,912)


def run_cluster(binary, *args):
    p = subprocess.run([binary, "--simulate", *args], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail("%s exited %d: %s" % (" ".join(args), p.returncode, p.stderr))
    if "MODEL, not a measurement" not in p.stdout:
        fail("the cluster table does not say it is a model")
    rows = {}
    for line in p.stdout.splitlines():
        if line.startswith("json: "):
            j = json.loads(line[len("json: "):])
            if not j.get("cluster"):
                fail("a single-host line in the cluster table: %r" % j)
            key = (j["link_gbps"], j["workers"], j["shards"], j["layout"], j["host_bwc"])
            if key in rows:
                fail("cluster configuration printed twice: %r" % (key,))
            if not (j["step_s"] > 0 and math.isfinite(j["step_s"])):
                fail("bad step time for %r: %r" % (key, j["step_s"]))
            rows[key] = j
    return rows


def check_cluster(binary):
    links, workers, shards = (25, 100, 400), (8, 16, 32, 64), (1, 2, 4, 8)
    rows = run_cluster(binary, "--shards", "1,2,4,8")  # defaults: llama-70b, 8-64 workers, 25/100/400 Gb/s
    if len(rows) != len(links) * len(workers) * len(shards) * 4:
        fail("%d cluster configurations printed, expected %d" % (len(rows), 3 * 4 * 4 * 4))
    for (link, w, s, layout, bwc), j in rows.items():
        if j["model"] != "llama-70b" or j["gpus_per_host"] != 8 or j["hosts"] != (w + 7) // 8:
            fail("%r: model %r, %r GPUs per host, %r hosts"
                 % ((link, w, s), j["model"], j["gpus_per_host"], j["hosts"]))
        if abs(j["params"] - P70) > 1e-9 * P70:
            fail("llama-70b has %r parameters, expected %r" % (j["params"], P70))
        copies = j["hosts"] if bwc else w
        out, inn = sum(j["shard_nic_out_bytes"]), sum(j["shard_nic_in_bytes"])
        if abs(out - copies * 2 * 2 * P70) > 1e-9 * out or abs(inn - copies * 4 * P70) > 1e-9 * inn:
            fail("%r: the shards send %r and receive %r bytes per step; %d copies of 2 x bf16 layers and fp32 "
                 "gradients are %r and %r" % ((link, w, s, layout, bwc), out, inn, copies, copies * 2 * 2 * P70,
                                               copies * 4 * P70))
        if len(j["shard_nic_out_bytes"]) != s:
            fail("%r: %d shards listed" % ((link, w, s, layout, bwc), len(j["shard_nic_out_bytes"])))
        if abs(j["tokens_per_s"] - w * j["tokens_per_gpu"] / j["step_s"]) > 1e-9 * j["tokens_per_s"]:
            fail("%r: tokens/s is not W x tokens per GPU / step" % ((link, w, s, layout, bwc),))
        if j["bottleneck"] not in j["seconds_by_resource"]:
            fail("%r: bottleneck %r is not a resource" % ((link, w, s, layout, bwc), j["bottleneck"]))
        parts = j["forward_s"] + j["backward_s"] + j["update_tail_s"] + j["overhead_s"]
        if abs(parts - j["step_s"]) > 1e-9 * j["step_s"]:
            fail("%r: the step is not forward + backward + tail + overhead" % ((link, w, s, layout, bwc),))
        # Doubling the shards halves each shard's traffic: stripes exactly, ranges up to one
        # layer (the embedding and the head are the largest: vocab x d).
        if s < 8:
            twice = rows[(link, w, 2 * s, layout, bwc)]
            a, b = max(j["shard_nic_out_bytes"]), max(twice["shard_nic_out_bytes"])
            if layout == "stripe" and abs(b - a / 2) > 1e-9 * a:
                fail("%r: striped over %d shards, a shard sends %r bytes, half of %r expected"
                     % ((link, w, s), 2 * s, b, a))
            if layout == "range" and b > a / 2 + copies * 2 * 2 * TABLE70:
                fail("%r: over %d ranges a shard sends %r bytes, more than half of %r plus a layer"
                     % ((link, w, s), 2 * s, b, a))
    one = rows[(25, 64, 1, "range", False)]
    if one["bottleneck"] != "shard NIC":
        fail("25 Gb/s, 64 workers, 1 shard: the bottleneck is %r, not the shard NIC" % one["bottleneck"])
    # 64 copies of every layer through one 25 Gb/s NIC: 2 bytes/param out in the forward,
    # 4 in (the gradients) in the backward.
    link = 25e9 / 8
    if abs(one["forward_s"] - 64 * 2 * P70 / link) > 1e-9 * one["forward_s"] or \
            abs(one["backward_s"] - 64 * 4 * P70 / link) > 1e-9 * one["backward_s"]:
        fail("25 Gb/s, 64 workers, 1 shard: forward %r backward %r, the NIC's time is %r and %r"
             % (one["forward_s"], one["backward_s"], 64 * 2 * P70 / link, 64 * 4 * P70 / link))
    # A faster link: the bottleneck moves off the network (unlimited shard RAM: no SSD).
    fast = run_cluster(binary, "--shards", "1,8", "--workers", "8,64", "--link-gbps", "1000000", "--shard-ram-gb", "0")
    for key, j in fast.items():
        if "NIC" in j["bottleneck"]:
            fail("at 1 Pb/s %r is still NIC-bound" % (key,))
    if fast[(1000000, 8, 1, "range", False)]["bottleneck"] != "compute":
        fail("at 1 Pb/s, 8 workers, 1 shard: %r, not compute" % fast[(1000000, 8, 1, "range", False)]["bottleneck"])
    # The shards update at the rates file's measured CPU AdamW rate: a slow one binds.
    path = write_json({"cpu_update_g": 0.05})
    try:
        slow = run_cluster(binary, "--shards", "1", "--workers", "8", "--link-gbps", "1000000", "--shard-ram-gb", "0",
                           "--rates-json", path)
    finally:
        os.unlink(path)
    j = slow[(1000000, 8, 1, "range", False)]
    if j["bottleneck"] != "shard update" or not j["shard_update_busy_s"][0] > P70 / 0.05e9:
        fail("--rates-json cpu_update_g 0.05: bottleneck %r, update busy %r s (AdamW alone takes %r s)"
             % (j["bottleneck"], j["shard_update_busy_s"], P70 / 0.05e9))
    # The overhead hook: (S - 1) x --shard-overhead-s on top, nothing else moves.
    base = run_cluster(binary, "--shards", "1,2,4", "--workers", "16", "--link-gbps", "100")
    over = run_cluster(binary, "--shards", "1,2,4", "--workers", "16", "--link-gbps", "100",
                       "--shard-overhead-s", "0.5")
    for key, j in base.items():
        if abs(over[key]["step_s"] - j["step_s"] - 0.5 * (key[2] - 1)) > 1e-9 * j["step_s"]:
            fail("%r: --shard-overhead-s 0.5 moved the step from %r to %r" % (key, j["step_s"], over[key]["step_s"]))
    # Without --shards the single-host table is printed, with no cluster line.
    p = subprocess.run([binary, "--simulate"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or '"cluster"' in p.stdout:
        fail("--simulate without --shards printed cluster lines (rc %d)" % p.returncode)
    # Bad flags name themselves.
    for bad, name in ((["--shards", "0"], "--shards"), (["--shards", "1", "--link-gbps", "-1"], "--link-gbps"),
                      (["--shards", "1", "--link-gbps", "0"], "--link-gbps"),
                      (["--shards", "1", "--workers", "0"], "--workers"),
                      (["--shards", "1", "--gpus-per-host", "0"], "--gpus-per-host"), (["--shards", "83"], "--shards"),
                      (["--shards", "1", "--shard-overhead-s", "-1"], "--shard-overhead-s"),
                      (["--shards", "1", "--ssd-gbps", "0"], "--ssd-gbps"),
                      (["--shards", "1", "--shard-nics", "0"], "--shard-nics"),
                      (["--shards", "1", "--gpu-sequences", "0"], "--gpu-sequences"),
                      (["--shards", "1", "--shard-ram-gb", "-5"], "--shard-ram-gb")):
        p = subprocess.run([binary, "--simulate", *bad], capture_output=True, text=True, timeout=60)
        if p.returncode == 0 or name not in p.stderr:
            fail("--simulate %s: rc %d, stderr %r (wanted an error naming %s)"
                 % (" ".join(bad), p.returncode, p.stderr, name))
        if "json:" in p.stdout:
            fail("--simulate %s printed a table before its error" % " ".join(bad))


def main():
    binary = sys.argv[1]
    check_cluster(binary)
    check_rates(binary)
    check(binary, "h100", ["--nvlink-gbps", "450"], monotone=True)
    check(binary, "dgx2", [], monotone=True)
    check(binary, "h100", [], monotone=False)
    for bad in (["--hw", "tpu"], ["--gpu-fraction", "1.5"], ["--devices", "0"], ["--shapes", "gpt5"],
                ["--seq-len", "-1"]):
        p = subprocess.run([binary, "--simulate", *bad], capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            fail("--simulate %s succeeded" % " ".join(bad))
    print("ok")


if __name__ == "__main__":
    main()
