"""`l2l` (cli/l2l_main.cc), the front door, end to end on a tiny byte-level model (CPU):
  1. `l2l tokenize` (forwarded to l2l-tokenize) makes a tokens file; `l2l run JOB --export hf`
     trains 12 steps and exports a Hugging Face directory; its progress on a pipe is plain
     `step k/12` lines, with --json JSON lines (the summary object last), with --quiet none;
     the summary is last. On a terminal (a pseudo-terminal here) it is one live line redrawn
     in place ("\r[###---] ... step k/12 ... tok/s ETA ...", no plain step lines), then the
     summary; an error is red on a terminal and plain on a pipe.
  2. Ctrl-C: `l2l run` of the same job gets SIGINT after step 5: exit 130, a checkpoint,
     "continue with --resume"; `l2l run --resume` finishes, and its exported weights equal the
     uninterrupted run's bit for bit.
  3. `l2l finetune --model <that export> --data text`: tokenizes (bytes: the export has no
     tokenizer.json), measures held-out perplexity before and after, trains, exports; the
     summary's perplexities are finite and the export loads as a model (l2l-eval).
  4. Bad usage exits 64; a missing job file exits 1 naming it.
usage: l2l_cli_test.py BIN_DIR WORK_DIR"""
import json
import math
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    l2l = os.path.join(bin_dir, "l2l")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    text = os.path.join(work, "text.txt")
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        open(text, "w").write(f.read()[:12000])

    def run(args, expect=0, timeout=600):
        p = subprocess.run([l2l] + args, capture_output=True, text=True, timeout=timeout, cwd=work)
        if p.returncode != expect:
            fail(f"l2l {' '.join(args)}: exit {p.returncode}, expected {expect}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    # 1. tokenize, run, export; progress modes.
    data = os.path.join(work, "data.bin")
    run(["tokenize", text, data])
    job = os.path.join(work, "job.yaml")
    with open(job, "w") as f:
        f.write(f"""model: {{vocab_size: 256, seq_len: 16, d_model: 32, n_layer: 2, n_head: 4, d_ff: 64}}
optim: {{lr: 3.0e-3, warmup_steps: 2}}
train: {{steps: 12, micro_batch_size: 2, micro_batches: 2, seed: 5, log_every: 1, mode: sync, checkpoint_every: 2}}
data: {{train_path: {data}}}
publish_dtype: f32
""")
    a = os.path.join(work, "a")
    p = run(["run", job, "--out", a, "--threads", "1"])
    steps = re.findall(r"^step (\d+)/12 ", p.stdout, re.M)
    if not steps or steps[-1] != "12":
        fail(f"plain progress lines expected up to step 12/12, got {steps}:\n{p.stdout}")
    last = p.stdout.strip().splitlines()[-1]
    if not last.startswith("l2l: logs:") or "l2l: finished 12 steps" not in p.stdout:
        fail(f"the summary must come last:\n{p.stdout}")
    export_a = os.path.join(a, "model-hf", "model.safetensors")
    if not os.path.isfile(export_a) or not os.path.isfile(os.path.join(a, "model-hf", "config.json")):
        fail(f"no Hugging Face export in {a}/model-hf")
    pj = run(["run", job, "--out", os.path.join(work, "j"), "--json", "--threads", "1", "--export", "none"])
    records = [json.loads(line) for line in pj.stdout.splitlines() if line.startswith("{")]
    if not records or records[-1].get("step") != 12 or not records[-1].get("done"):
        fail(f"--json: JSON lines ending at step 12 expected:\n{pj.stdout}")
    pq = run(["run", job, "--out", os.path.join(work, "q"), "--quiet", "--threads", "1", "--export", "none"])
    if re.search(r"^step \d+/", pq.stdout, re.M) or pq.stderr.strip():
        fail(f"--quiet printed progress:\n{pq.stdout}\n{pq.stderr}")
    if not records[-1].get("summary") or records[-1].get("end") != "finished" or not pj.stdout.strip().endswith("}"):
        fail(f"--json: the summary object must come last:\n{pj.stdout}")
    run(["run", job, "--out", a], expect=1)  # a checkpoint is there: refused without --resume

    # 1b. on a terminal: the live line. Pushes slowed by 40 ms so it is redrawn several times.
    def run_pty(args, env=None):
        master, slave = pty.openpty()
        proc = subprocess.Popen([l2l] + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=work,
                                env=env)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        return proc.wait(timeout=600), b"".join(chunks).decode("utf-8", errors="replace")
    rc, out = run_pty(["run", job, "--out", os.path.join(work, "t"), "--threads", "1", "--export", "none"],
                      env=dict(os.environ, L2L_DELAY_AT="worker.push:40"))
    if rc != 0:
        fail(f"l2l run on a terminal: exit {rc}\n{out}")
    live = re.findall(r"\r\[[#-]+\] +\d+% step (\d+)/12 ", out)
    if len(set(live)) < 2 or live[-1] != "12" or "\x1b[K" not in out or "tok/s  ETA " not in out:
        fail(f"a live line redrawn in place up to step 12/12 expected on a terminal, got steps {live}:\n{out!r}")
    if re.search(r"^step \d+/12 loss", out, re.M):
        fail(f"plain step lines on a terminal:\n{out!r}")
    tail = out[out.rindex("\r["):]
    lines = [x.strip() for x in tail.split("\n") if x.strip()]
    if "l2l: finished 12 steps" not in tail or not lines[-1].startswith("l2l: logs:"):
        fail(f"the summary must come after the live line, last:\n{tail!r}")
    rc, out = run_pty(["run", os.path.join(work, "no-such-job.yaml")])
    if rc != 1 or "\x1b[1;31ml2l: error:" not in out:
        fail(f"an error on a terminal must stand out (red), exit 1:\n{out!r}")
    print(f"terminal: a live line redrawn {len(live)} times, the summary last")

    # 2. SIGINT after step 5, then --resume: the same weights as the uninterrupted run.
    b = os.path.join(work, "b")
    # Each gradient push slowed by 40 ms (a fault site's delay: timing only), so the 12
    # steps take seconds and the interrupt lands mid-job.
    env = dict(os.environ, L2L_DELAY_AT="worker.push:40")
    proc = subprocess.Popen([l2l, "run", job, "--out", b, "--threads", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=work, env=env)
    runlog = os.path.join(b, "state", "run.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            fail(f"l2l run ended before the interrupt: {proc.communicate()}")
        try:
            n = sum(1 for line in open(runlog) if '"loss"' in line)
        except FileNotFoundError:
            n = 0
        if n >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 130:
        fail(f"SIGINT: exit {proc.returncode}, expected 130\n{out}\n{err}")
    if "continue with --resume" not in out or not os.path.exists(os.path.join(b, "state", "checkpoints", "latest")):
        fail(f"SIGINT: a checkpoint and the way to continue expected:\n{out}\n{err}")
    step_at_stop = re.search(r"interrupted at step (\d+)", out)
    if not step_at_stop or not 4 <= int(step_at_stop.group(1)) < 12:
        fail(f"SIGINT: stopped at an unexpected step:\n{out}")
    run(["run", job, "--out", b, "--resume", "--quiet", "--threads", "1"])
    if open(os.path.join(b, "model-hf", "model.safetensors"), "rb").read() != open(export_a, "rb").read():
        fail("the interrupted + resumed run's weights differ from the uninterrupted run's")
    print(f"interrupted at step {step_at_stop.group(1)}, resumed: weights equal bit for bit")

    # 3. finetune the export on text.
    d = os.path.join(work, "d")
    p = run(["finetune", "--model", os.path.join(a, "model-hf"), "--data", text, "--out", d, "--steps", "3",
             "--seq-len", "16", "--batch", "2", "--threads", "1", "--quiet"])
    m = re.search(r"held-out perplexity ([0-9.naninf]+) -> ([0-9.naninf]+)", p.stdout)
    if not m or not all(math.isfinite(float(x)) and float(x) > 1 for x in m.groups()):
        fail(f"finetune: finite before/after perplexities expected:\n{p.stdout}\n{p.stderr}")
    if not os.path.isfile(os.path.join(d, "model-hf", "model.safetensors")) or not os.path.isfile(
            os.path.join(d, "job.yaml")):
        fail(f"finetune: job.yaml and model-hf expected in {d}")
    ev = run(["eval", "--model", os.path.join(d, "model-hf"), "--data", os.path.join(d, "data", "val.bin"),
              "--context", "16"])
    if "perplexity" not in ev.stdout:
        fail(f"l2l eval of the finetuned model:\n{ev.stdout}")
    print(f"finetune: perplexity {m.group(1)} -> {m.group(2)}")

    # 4. usage and missing files.
    run(["finetune", "--data", text], expect=64)
    run(["frobnicate"], expect=64)
    p = run(["run", os.path.join(work, "no-such-job.yaml")], expect=1)
    if "no-such-job.yaml" not in p.stderr or "\x1b[" in p.stderr:
        fail(f"a missing job file must be named (no colour on a pipe):\n{p.stderr}")
    print("OK")


if __name__ == "__main__":
    main()
