#!/usr/bin/env python3
"""Resume at the size of issue 27, on the CPU: a reduced-width 7B-class shape whose state
is 3x memory.host_bytes (two thirds of it in the SSD tier) is checkpointed every 2 steps,
its daemon killed with SIGKILL in the middle of step 7, restarted with --resume (the spill
file rebuilt from the checkpoint), its workers restarted; the final weights and the
whole optimizer state (master, AdamW m and v: the final checkpoint's layer files) must
equal an uninterrupted run of the same job that keeps everything in RAM, bit for bit.

Shapes (--shape): qwen2.5-7b: the preset's family fields (q/k/v biases, grouped-query
attention 7:1, untied head, RoPE base 1e6, RMSNorm eps 1e-6) at width 64 and 8 layers;
llama-3.1-8b: its fields (4:1 GQA, RoPE base 500000 with llama3 scaling, eps 1e-5).

The kill is the daemon's own SIGKILL at a named site (L2L_FAULT_AT=eps.update:N,
common/fault_point.h): a layer's AdamW applied in step 7 with that step not committed,
after the checkpoints of steps 2, 4 and 6 (the last one written is resumed from);
deterministic where a kill from here would race a job of milliseconds per step. The budget comes from the reference daemon's own status (its
state and shm bytes at 4 KiB pages): host_bytes = shm + state / 3.

Usage: spill_resume_test.py BIN_DIR [--shape qwen2.5-7b|llama-3.1-8b] [--transport shm|grpc] [--keep]
"""
import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402
from chaos_test import Cluster, Failure, finish, run_scenario  # noqa: E402

STEPS = 8
LAYERS = 10  # embedding, 8 blocks, final norm + head
PAGE = 4096

SHAPES = {
    "qwen2.5-7b": """  family: llama
  vocab_size: 96
  seq_len: 16
  d_model: 64
  n_layer: 8
  n_head: 8
  n_kv_heads: 1
  d_ff: 160
  rope_theta: 1000000
  rms_norm_eps: 1.0e-6
  qkv_bias: true
  tied_embeddings: false
""",
    "llama-3.1-8b": """  family: llama
  vocab_size: 96
  seq_len: 16
  d_model: 64
  n_layer: 8
  n_head: 8
  n_kv_heads: 2
  d_ff: 224
  rope_theta: 500000
  rms_norm_eps: 1.0e-5
  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8}
  tied_embeddings: false
""",
}


def write_job(work, shape):
    tokens = os.path.join(work, "train.bin")
    l2l_procs.write_tokens(tokens, 20000, 96)
    path = os.path.join(work, "job.yaml")
    with open(path, "w") as f:
        f.write("model:\n" + SHAPES[shape] + f"""optim:
  lr: 3.0e-3
  warmup_steps: 2
  eps: 1.0e-6
train:
  steps: {STEPS}
  micro_batch_size: 2
  micro_batches: 2
  seed: 77
  log_every: 1
  mode: sync
  checkpoint_every: 2
data:
  train_path: {tokens}
publish_dtype: f32
""")
    return path


def tiers(st):
    return {m["tier"]: m["used_bytes"] for m in st["memory"]}


def status(c, timeout=60):
    """c's daemon status, retried while l2lctl gets no answer (a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        st = c.status()
        if st is not None:
            return st
        if time.monotonic() > deadline:
            raise Failure("%s: l2lctl status got no answer in %d s:\n%s" % (c.name, timeout, c.eps.tail()))
        time.sleep(0.2)


def checkpoint_layers(d):
    return {n: l2l_procs.read_bytes(os.path.join(d, n)) for n in sorted(os.listdir(d)) if n.startswith("layer-")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--shape", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--transport", default="shm", choices=["shm", "grpc"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    def scenario(procs, work, shown):
        job_yaml = write_job(work, a.shape)
        ram_cfg = os.path.join(work, "eps-ram.yaml")
        with open(ram_cfg, "w") as f:
            f.write(f"memory: {{page_bytes: {PAGE}}}\nspill: {{block_bytes: {PAGE}}}\n")

        # The uninterrupted run, all state in RAM.
        ref = Cluster(procs, work, job_yaml, a.transport, "ref")
        shown.append(ref)
        ref.eps_args = ["--config", ram_cfg]
        if not ref.start_eps():
            raise Failure("reference l2l-eps did not start:\n" + ref.eps.tail())
        mem = tiers(status(ref))
        state, shm = mem["ram"], mem["shm"]
        for i in range(2):
            ref.start_worker(i)
        for i in range(2):
            if ref.workers[i].wait(300) != 0:
                raise Failure("reference worker w%d failed:\n%s" % (i, ref.workers[i].tail()))
        ref_export, ref_ckpt = finish(procs, ref, STEPS)

        # The same job with its state 3x the host budget, killed and resumed.
        spill_dir = os.path.join(work, "spill")
        os.makedirs(spill_dir)
        host = shm + state // 3
        spill_cfg = os.path.join(work, "eps-spill.yaml")
        with open(spill_cfg, "w") as f:
            f.write(f"memory: {{host_bytes: {host}, page_bytes: {PAGE}}}\n"
                    f"spill: {{dir: {spill_dir}, block_bytes: {PAGE}, prefetch_layers: 1}}\n")
        c = Cluster(procs, work, job_yaml, a.transport, "spill")
        shown.append(c)
        c.eps_args = ["--config", spill_cfg]
        # A layer's update of step 7 (0-based 6), after the checkpoints of steps 2, 4, 6 (the
        # daemon holds updates at a checkpoint's boundary until it is written; one whose
        # hold came late on a loaded machine is skipped, so any of them may be the last).
        c.env_next["eps"] = "eps.update:%d" % (LAYERS * 6 + 3)
        if not c.start_eps():
            raise Failure("spilled l2l-eps did not start:\n" + c.eps.tail())
        m = tiers(status(c))
        # Two thirds or more of the state on SSD, and not all of it (RAM keeps a part).
        if m.get("ssd", 0) * 3 < state * 2 or m.get("ssd", 0) >= state:
            raise Failure("the SSD tier holds %d of %d state bytes (host_bytes %d): want >= 2/3 and < all" % (
                m.get("ssd", 0), state, host))
        for i in range(2):
            c.start_worker(i)
        if c.eps.wait(300) != -signal.SIGKILL or "injected SIGKILL at eps.update" not in c.eps.log():
            raise Failure("the daemon was to kill itself at eps.update:\n" + c.eps.tail())
        try:
            latest = open(os.path.join(c.ckpt_root(), "latest")).read().strip()
        except OSError as e:
            raise Failure("no checkpoint before the kill: %s" % e)
        if latest not in ("step-00000002", "step-00000004", "step-00000006"):
            raise Failure("the checkpoint before the kill is %s, want step 2, 4 or 6" % latest)
        ckpt_step = int(latest.split("-")[1])
        deadline = time.monotonic() + 300
        resumed = None
        while True:
            c.supervise()
            st = c.status()
            if resumed is None and st is not None:
                resumed = st
            if st and st["step"] == STEPS and st["state"] == "finished":
                break
            if time.monotonic() > deadline:
                raise Failure("the resumed job did not finish in 300 s: %s" % st)
            time.sleep(0.1)
        if c.starts["eps"] != 2 or c.site_fired != [("eps", "eps.update")]:
            raise Failure("want one SIGKILL of the daemon and one --resume; starts %s, fired %s, unexpected %s" % (
                c.starts, c.site_fired, c.unexpected))
        if resumed is None or resumed["step"] < ckpt_step:
            raise Failure("the resumed daemon did not start from the %s checkpoint: %s" % (latest, resumed))
        m2 = tiers(resumed)
        if m2.get("ssd", 0) != m["ssd"]:
            raise Failure("the resumed daemon's SSD tier holds %s bytes, the first one's %d" % (m2.get("ssd"), m["ssd"]))
        for i in range(2):
            code = c.workers[i].wait(60)
            if code != 0:
                raise Failure("w%d exited %s:\n%s" % (i, code, c.workers[i].tail()))
        got_export, got_ckpt = finish(procs, c, STEPS)
        diff = l2l_procs.compare_weights(got_export, ref_export)
        if diff:
            raise Failure("final weights differ from the uninterrupted in-RAM run: " + diff)
        want, got = checkpoint_layers(ref_ckpt), checkpoint_layers(got_ckpt)
        if len(want) != LAYERS or want.keys() != got.keys():
            raise Failure("final checkpoints: layer files %s vs %s" % (sorted(got), sorted(want)))
        differ = [n for n in want if want[n] != got[n]]
        if differ:
            raise Failure("final master/m/v differ from the uninterrupted in-RAM run in %s" % differ)
        return ("%s at width 64: state %d bytes, host_bytes %d, %d bytes on SSD; SIGKILL in step 7 after the "
                "checkpoint %s, --resume: final weights and master/m/v equal the uninterrupted in-RAM run "
                "bit for bit" % (a.shape, state, host, m["ssd"], latest))

    return run_scenario("spill_resume", a.bin_dir, a.transport, a.keep, scenario)


if __name__ == "__main__":
    sys.exit(main())
