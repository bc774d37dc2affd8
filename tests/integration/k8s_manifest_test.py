#!/usr/bin/env python3
"""deploy/k8s/ checked without a Kubernetes cluster (none runs here):

  1. Every manifest parses (PyYAML, safe_load_all) into the objects the README names:
     ConfigMap l2l-config (eps.yaml, job.yaml), PVCs l2l-checkpoints and l2l-data, the
     headless Service and StatefulSet l2l-eps, the Indexed Job l2l-workers; the volumes
     the pods mount exist; L2L_WORKERS equals the Job's parallelism and completions.
  2. Every --flag the shard and worker commands pass exists in `l2l-eps --help` /
     `l2l-worker --help` (the sharding flags --shard, --coordinator, --advertise included).
  3. make-secret.sh makes token, tls.crt, tls.key (mode 0600, directory 0700) whose
     certificate names every shard's stable DNS name.
  4. The pods' commands run here, outside Kubernetes: the StatefulSet's shard script and
     the Job's worker script, taken from the manifests, with the mount paths mapped to a
     temporary directory, the listen address to 127.0.0.1:0 and the job shortened; the
     ConfigMap's eps.yaml and job.yaml (data: a token walk written here), the secrets
     from make-secret.sh (TLS + token, verified by the worker against 127.0.0.1). The
     worker must train the job to its end and exit 0; then the shard script run again
     must resume from the shared checkpoint root (the daemon says so).

Without PyYAML for /usr/bin/python3 (python3-yaml, scripts/setup.sh) or openssl it prints
a SKIPPED banner and exits 77; with CI=true it fails instead.
Usage: k8s_manifest_test.py BIN_DIR [--keep]
"""
import argparse
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l2l_procs  # noqa: E402

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(REPO, "deploy", "k8s")
PENDING_FLAGS = set()  # every flag the manifests use exists now
STEPS = 4


class Failure(Exception):
    pass


def skip(why):
    bar = "!" * 78
    in_ci = os.environ.get("CI") == "true"
    print("%s\nk8s: %s: %s\n  deploy/k8s/ is NOT checked here.\n%s%s" % (
        bar, "FAILED" if in_ci else "SKIPPED", why,
        "  CI=true: a skip is a failure here (scripts/setup.sh installs python3-yaml and openssl).\n" if in_ci else "",
        bar))
    sys.exit(1 if in_ci else SKIP)


def load(yaml):
    objs = {}
    for name in ("config.yaml", "eps-statefulset.yaml", "workers-job.yaml"):
        with open(os.path.join(K8S, name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                objs[(doc["kind"], doc["metadata"]["name"])] = doc
    want = [("ConfigMap", "l2l-config"), ("PersistentVolumeClaim", "l2l-checkpoints"),
            ("PersistentVolumeClaim", "l2l-data"), ("Service", "l2l-eps"), ("StatefulSet", "l2l-eps"),
            ("Job", "l2l-workers")]
    missing = [w for w in want if w not in objs]
    if missing:
        raise Failure("deploy/k8s/ lacks %s (has %s)" % (missing, sorted(objs)))
    return objs


def container(obj):
    pod = obj["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        if m["name"] not in volumes:
            raise Failure("%s mounts volume %s, which the pod does not define" % (obj["metadata"]["name"], m["name"]))
    return c, volumes


def script(c):
    cmd = c["command"]
    if cmd[:2] != ["/bin/sh", "-c"] or len(cmd) != 3:
        raise Failure("container %s: expected command [/bin/sh, -c, SCRIPT], got %s" % (c["name"], cmd))
    return cmd[2]


def check_structure(objs):
    svc, sts, job = objs[("Service", "l2l-eps")], objs[("StatefulSet", "l2l-eps")], objs[("Job", "l2l-workers")]
    if svc["spec"].get("clusterIP") != "None" or sts["spec"]["serviceName"] != "l2l-eps":
        raise Failure("the l2l-eps Service must be headless and the StatefulSet's serviceName")
    eps_c, eps_vols = container(sts)
    wk_c, wk_vols = container(job)
    env = {e["name"]: e.get("value") for e in eps_c["env"]}
    if int(env["L2L_SHARDS"]) != sts["spec"]["replicas"]:
        raise Failure("StatefulSet replicas %s != L2L_SHARDS %s" % (sts["spec"]["replicas"], env["L2L_SHARDS"]))
    js = job["spec"]
    if not int(env["L2L_WORKERS"]) == js["parallelism"] == js["completions"] or js.get("completionMode") != "Indexed":
        raise Failure("L2L_WORKERS %s, Job parallelism %s, completions %s, mode %s: expected equal, Indexed" % (
            env["L2L_WORKERS"], js["parallelism"], js["completions"], js.get("completionMode")))
    for vols in (eps_vols, wk_vols):
        if vols["secrets"]["secret"]["secretName"] != "l2l-secrets":
            raise Failure("the pods must mount the l2l-secrets Secret")
    claims = {v["persistentVolumeClaim"]["claimName"] for v in eps_vols.values() if "persistentVolumeClaim" in v}
    if claims != {"l2l-checkpoints", "l2l-data"}:
        raise Failure("the shards mount %s, expected l2l-checkpoints and l2l-data" % sorted(claims))
    return eps_c, wk_c


def check_flags(bin_dir, eps_script, wk_script):
    pending = []
    for prog, text in (("l2l-eps", eps_script), ("l2l-worker", wk_script)):
        r = subprocess.run([os.path.join(bin_dir, prog), "--help"], capture_output=True, text=True, timeout=60)
        known = set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout))
        used = sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)))
        if not used:
            raise Failure("no flags found in the %s command" % prog)
        for flag in used:
            if flag in known:
                continue
            if prog == "l2l-eps" and flag in PENDING_FLAGS:
                pending.append(flag)
                continue
            raise Failure("the %s command passes %s, which `%s --help` does not list" % (prog, flag, prog))
        print("k8s: %s flags in the manifest, all in --help%s: %s" % (
            prog, " (but the pending ones)" if prog == "l2l-eps" else "", " ".join(f for f in used
                                                                               if f not in PENDING_FLAGS)))
    return sorted(pending)


def make_secrets(work):
    out = os.path.join(work, "secrets")
    r = subprocess.run([os.path.join(K8S, "make-secret.sh"), out, "l2l-test", "3"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise Failure("make-secret.sh failed: %s" % r.stderr)
    if stat.S_IMODE(os.stat(out).st_mode) != 0o700:
        raise Failure("make-secret.sh's directory has mode %o" % stat.S_IMODE(os.stat(out).st_mode))
    for f in ("token", "tls.crt", "tls.key"):
        mode = stat.S_IMODE(os.stat(os.path.join(out, f)).st_mode)
        if mode != 0o600:
            raise Failure("make-secret.sh's %s has mode %o" % (f, mode))
    with open(os.path.join(out, "token")) as f:
        token = f.read().strip()
    if token in r.stdout + r.stderr or len(token) < 32:
        raise Failure("make-secret.sh printed the token or made a short one")
    r = subprocess.run(["openssl", "x509", "-in", os.path.join(out, "tls.crt"), "-noout", "-ext", "subjectAltName"],
                       capture_output=True, text=True, timeout=60)
    names = set(re.findall(r"DNS:([^,\s]+)", r.stdout))
    for k in range(3):
        for name in ("l2l-eps-%d.l2l-eps" % k, "l2l-eps-%d.l2l-eps.l2l-test.svc.cluster.local" % k):
            if name not in names:
                raise Failure("the certificate does not name %s: %s" % (name, r.stdout))
    bad = subprocess.run([os.path.join(K8S, "make-secret.sh"), os.path.join(work, "x"), "Bad_NS"], capture_output=True,
                         text=True, timeout=60)
    if bad.returncode != 2 or "NAMESPACE" not in bad.stderr or os.path.exists(os.path.join(work, "x")):
        raise Failure("make-secret.sh with a bad namespace: exit %d: %s" % (bad.returncode, bad.stderr))
    return out


def localize(text, work):
    """The pods' paths mapped into `work`, the listen address to loopback port 0."""
    for a, b in (("/etc/l2l/config", work + "/config"), ("/etc/l2l/secrets", work + "/secrets"),
                 ("/ckpt", work + "/ckpt"), ("/data", work + "/data"), ("0.0.0.0:7070", "127.0.0.1:0")):
        text = text.replace(a, b)
    return text


def run_pods(procs, work, objs, eps_script, wk_script):
    cm = objs[("ConfigMap", "l2l-config")]["data"]
    os.makedirs(os.path.join(work, "config"))
    os.makedirs(os.path.join(work, "data"))
    os.makedirs(os.path.join(work, "ckpt"))
    with open(os.path.join(work, "config", "eps.yaml"), "w") as f:
        f.write(localize(cm["eps.yaml"], work))
    job = cm["job.yaml"]
    job, n1 = re.subn(r"(?m)^(\s*)steps: \d+$", r"\g<1>steps: %d" % STEPS, job)
    job, n2 = re.subn(r"(?m)^(\s*)checkpoint_every: \d+$", r"\g<1>checkpoint_every: 2", job)
    if n1 != 1 or n2 != 1:
        raise Failure("the ConfigMap's job.yaml has no train.steps / train.checkpoint_every to shorten")
    with open(os.path.join(work, "config", "job.yaml"), "w") as f:
        f.write(localize(job, work))
    vocab = int(re.search(r"vocab_size: (\d+)", job).group(1))
    for name in ("train.bin", "val.bin"):
        l2l_procs.write_tokens(os.path.join(work, "data", name), 20000, vocab)
    path = os.path.abspath(procs.bin_dir) + ":" + os.environ.get("PATH", "/usr/bin:/bin")
    eps_env = {"PATH": path, "HOSTNAME": "l2l-eps-0", "L2L_SHARDS": "1", "L2L_WORKERS": "1"}

    def start_shard(name):
        p = procs.spawn(name, ["/bin/sh", "-c", localize(eps_script, work)], env=eps_env)
        # The port from the log: the state dir's eps.port may be the last run's.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.running():
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", p.log())
            if m and l2l_procs.wait_port(os.path.join(work, "ckpt", "state", "shard-0"), p, 10) == int(m.group(1)):
                return p, int(m.group(1))
            time.sleep(0.05)
        raise Failure("the StatefulSet's shard command did not start l2l-eps:\n%s" % p.tail())

    eps, port = start_shard("shard-0")
    wk = localize(wk_script, work).replace("l2l-eps-0.l2l-eps:7070", "127.0.0.1:%d" % port)
    w = procs.spawn("worker-0", ["/bin/sh", "-c", wk],
                    env={"PATH": path, "HOSTNAME": "l2l-workers-0-abcde", "JOB_COMPLETION_INDEX": "0",
                         "L2L_DEVICE": "cpu"})
    code = w.wait(300)
    if code != 0:
        raise Failure("the Job's worker command exited %s:\n%s\n---- shard\n%s" % (code, w.tail(), eps.tail()))
    ctl = ["--tls-ca", os.path.join(work, "secrets", "tls.crt"), "--token-file", os.path.join(work, "secrets", "token")]
    st = procs.status("127.0.0.1:%d" % port, ctl_flags=ctl)
    if not st or st["state"] != "finished" or st["step"] != STEPS:
        raise Failure("after the worker: %s" % st)
    code, out, err = procs.ctl("127.0.0.1:%d" % port, ["stop"], ctl_flags=ctl)
    if code != 0 or eps.wait(60) != 0:
        raise Failure("stopping the shard failed: %s %s\n%s" % (out, err, eps.tail()))
    if not os.path.exists(os.path.join(work, "ckpt", "checkpoints", "latest")):
        raise Failure("no checkpoint in the shared root (ConfigMap eps.yaml checkpoint.dir)")
    # The pod restarted: the same command resumes.
    eps2, port2 = start_shard("shard-0-restarted")
    if not re.search(r"start step %d from checkpoint %s" % (STEPS, re.escape(os.path.join(work, "ckpt", "checkpoints"))),
                     eps2.log()):
        raise Failure("the restarted shard did not resume from the shared checkpoint root:\n" + eps2.tail())
    code, out, err = procs.ctl("127.0.0.1:%d" % port2, ["stop"], ctl_flags=ctl)
    if code != 0 or eps2.wait(60) != 0:
        raise Failure("stopping the restarted shard failed: %s %s" % (out, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    try:
        import yaml  # noqa: PLC0415
    except ImportError:
        skip("PyYAML is not importable by %s (python3-yaml)" % sys.executable)
    if not shutil.which("openssl"):
        skip("openssl is not installed")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="l2l-k8s-")
    procs = l2l_procs.Procs(a.bin_dir, work)
    ok = False
    try:
        objs = load(yaml)
        eps_c, wk_c = check_structure(objs)
        print("k8s: manifests parse: %s" % ", ".join("%s/%s" % k for k in sorted(objs)))
        eps_script, wk_script = script(eps_c), script(wk_c)
        pending = check_flags(a.bin_dir, eps_script, wk_script)
        subprocess.run(["sh", "-n", "-c", eps_script], check=True)
        subprocess.run(["sh", "-n", "-c", wk_script], check=True)
        make_secrets(work)
        print("k8s: make-secret.sh: token, tls.crt, tls.key mode 0600 in a 0700 directory; the certificate names "
              "l2l-eps-K.l2l-eps[.NS.svc[.cluster.local]] for 3 shards")
        run_pods(procs, work, objs, eps_script, wk_script)
        print("k8s: the StatefulSet's shard command and the Job's worker command ran here (not in Kubernetes): "
              "%d steps over TLS + token, exit 0; the shard command run again resumed from the shared checkpoint root"
              % STEPS)
        if pending:
            raise Failure("flags not in --help: %s" % " ".join(pending))
        print("k8s: NOT checked here: anything in a cluster (scheduling, DNS, volumes, the Secret), more than one "
              "shard pod")
        print("k8s: passed in %.1f s" % (time.monotonic() - t0))
        ok = True
    except (Failure, subprocess.CalledProcessError, KeyError, ValueError, TypeError) as e:
        print("k8s: FAILED: %s: %s" % (type(e).__name__, e))
        for p in procs.all:
            print("---- %s (tail)\n%s" % (p.name, p.tail(15)))
    finally:
        alive = procs.close()
        if alive:
            print("k8s: FAILED: processes outlived the test: %s" % alive)
            ok = False
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("k8s: work dir kept: %s" % work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
