#!/usr/bin/env python3
"""The shard overhead on one host (issue 31, docs/performance.md "Scaling out"): the same
job trained by 1, 2 and 4 l2l-eps shards (loopback, each shard a process with its own
layers), the same workers, in one run with the order alternating (1 2 4 4 2 1 ...), so
the machine's load drifts alike over every count. Per count: the median step time
(shard 0's run.jsonl step_s over the timed steps), its ratio to 1 shard, and the
least-squares slope of step time against S - 1: the per-shard overhead that
`l2l-bench-relay --simulate --shards S --shard-overhead-s X` takes.

Usage: bench_shards.py BIN_DIR [--rounds 3] [--steps 20] [--warmup 3] [--workers 1]
                               [--d-model 256] [--layers 8] [--shards 1,2,4] [--transport auto]
Prints one line per run and a summary table; exits non-zero when a run fails or its
final weights differ from the first 1-shard run's (every run trains the same steps).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import l2l_procs  # noqa: E402


def write_job(path, tokens, steps, d_model, layers):
    with open(path, "w") as f:
        f.write(f"""model:
  vocab_size: 512
  seq_len: 64
  d_model: {d_model}
  n_layer: {layers}
  n_head: 4
  d_ff: {4 * d_model}
optim:
  lr: 1.0e-3
  warmup_steps: 2
train:
  steps: {steps}
  micro_batch_size: 4
  micro_batches: 2
  seed: 5
  log_every: 1
  mode: sync
  checkpoint_every: 0
data:
  train_path: {tokens}
publish_dtype: bf16
""")


def run(procs, work, tag, shards, workers, transport, job, total_steps):
    d = os.path.join(work, tag)
    os.makedirs(d)
    cfg = os.path.join(d, "eps.yaml")
    with open(cfg, "w") as f:
        f.write("checkpoint:\n  dir: %s\n" % os.path.join(d, "ckpt"))
    common = ["--job", job, "--workers", str(workers), "--config", cfg, "--job-id", "bs%d-%s" % (os.getpid(), tag)]
    eps = []
    s0 = os.path.join(d, "s0")
    first = ["--shard", "0/%d" % shards] if shards > 1 else []
    eps.append(procs.spawn(tag + "-eps0", [procs.bin("l2l-eps"), "--state-dir", s0] + common + first))
    port = l2l_procs.wait_port(s0, eps[0], 60)
    if port is None:
        raise RuntimeError("%s: shard 0 did not start:\n%s" % (tag, eps[0].tail()))
    for k in range(1, shards):
        eps.append(procs.spawn("%s-eps%d" % (tag, k),
                               [procs.bin("l2l-eps"), "--state-dir", os.path.join(d, "s%d" % k)] + common +
                               ["--shard", "%d/%d" % (k, shards), "--coordinator", "127.0.0.1:%d" % port]))
    ws = [procs.spawn("%s-w%d" % (tag, w), [procs.bin("l2l-worker"), "--eps", "127.0.0.1:%d" % port, "--device", "cpu",
                                            "--transport", transport]) for w in range(workers)]
    for w in ws:
        code = w.wait(900)
        if code != 0:
            raise RuntimeError("%s: worker exited %s:\n%s" % (tag, code, w.tail()))
    for e in eps:
        e.popen.terminate()
    for e in eps:
        if e.wait(120) != 0:
            raise RuntimeError("%s: a shard exited %s:\n%s" % (tag, e.popen.returncode, e.tail()))
    steps = []
    with open(os.path.join(s0, "run.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "step_s" in r:
                steps.append((r["step"], r["step_s"]))
    latest = os.path.join(d, "ckpt", open(os.path.join(d, "ckpt", "latest")).read().strip())
    weights = {n: l2l_procs.read_bytes(os.path.join(latest, n)) for n in sorted(os.listdir(latest))
               if n.startswith("layer-")}
    return steps, weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--transport", default="auto")
    a = ap.parse_args()
    counts = [int(x) for x in a.shards.split(",")]
    work = tempfile.mkdtemp(prefix="l2l-bench-shards-")
    procs = l2l_procs.Procs(a.bin_dir, work)
    total = a.warmup + a.steps
    times = {s: [] for s in counts}
    reference = None
    try:
        tokens = os.path.join(work, "tokens.bin")
        l2l_procs.write_tokens(tokens, 200000, 512)
        job = os.path.join(work, "job.yaml")
        write_job(job, tokens, total, a.d_model, a.layers)
        order = []
        for r in range(a.rounds):
            order += counts if r % 2 == 0 else list(reversed(counts))
        for i, s in enumerate(order):
            steps, weights = run(procs, work, "r%d-s%d" % (i, s), s, a.workers, a.transport, job, total)
            timed = [t for (step, t) in steps if step > a.warmup]
            med = statistics.median(timed)
            times[s].append(med)
            if reference is None:
                reference = weights
            elif weights != reference:
                print("bench_shards: run %d (%d shards): final weights differ from the first run's" % (i, s))
                return 1
            print("run %2d  shards %d  median step %.4f s over %d steps" % (i, s, med, len(timed)), flush=True)
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times[counts[0]])
    print("\nshards  median step (s)  ratio to %d shard(s)" % counts[0])
    for s in counts:
        m = statistics.median(times[s])
        print("%6d  %15.4f  %8.3f" % (s, m, m / base))
    xs = [s - 1 for s in counts for _ in times[s]]
    ys = [t for s in counts for t in times[s]]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    print("per-shard overhead (least-squares slope of step time on S-1): %.5f s  -> --shard-overhead-s %.5f"
          % (slope, max(slope, 0.0)))
    print("final weights of every run equal bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
