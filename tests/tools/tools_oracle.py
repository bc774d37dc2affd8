"""Oracle tests of l2l-eval and l2l-sample against Hugging Face transformers.

  tools_oracle.py BIN_DIR WORK_DIR synthetic    (a) l2l-eval's loss equals the mean
        cross-entropy of a random LlamaForCausalLM (saved by save_pretrained, with a
        byte-level BPE tokenizer.json trained here by `tokenizers`) on the same windows,
        with and without a loss mask; (b) greedy l2l-sample ids for 32 tokens equal
        model.generate(do_sample=False) from the same prompt ids, and the printed text is
        the tokenizer's decoding of them; (d) bad inputs get one-line errors naming what
  tools_oracle.py BIN_DIR WORK_DIR smollm2 GGUF  (c) the real SmolLM2-135M GGUF:
        perplexity on 512 tokens of a Debian text (tokenized by l2l-tokenize with the
        GGUF's tokenizer) vs transformers' GGUF loader on the same tokens (rel <= 1e-3),
        and greedy ids for 16 tokens equal HF generate's

Exits non-zero with a message on the first failure. Run with the oracle venv's python
(scripts/oracle_venv.sh) and HF_HUB_OFFLINE=1.
"""
import json
import math
import os
import re
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers GGUF loader progress bar
import numpy as np
import torch
import transformers
transformers.utils.logging.disable_progress_bar()
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
EOS = "<|endoftext|>"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(args, expect_ok=True):
    # A random model's sample may hold incomplete UTF-8: decode as the tokenizer's decoder does.
    p = subprocess.run(args, capture_output=True)
    p.stdout = p.stdout.decode("utf-8", errors="replace")
    p.stderr = p.stderr.decode("utf-8", errors="replace")
    if expect_ok and p.returncode != 0:
        fail(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def read_tokens(path):
    with open(path, "rb") as f:
        hdr = np.frombuffer(f.read(1024), dtype=np.int32)
        if hdr[0] != 20240520:
            fail(f"{path}: bad magic")
        dt = np.uint16 if hdr[1] == 1 else np.uint32
        return [int(x) for x in np.frombuffer(f.read(), dtype=dt)[:hdr[2]]]


def write_tokens(path, toks, width=2):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1 if width == 2 else 2, len(toks)
    hdr[3] = width
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16 if width == 2 else np.uint32).tobytes())


def write_mask(path, mask):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240522, 1, len(mask)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(mask, dtype=np.uint8).tobytes())


def parse_eval(out):
    m = re.search(r"eval: loss (\S+) perplexity (\S+) tokens (\d+)", out)
    if not m:
        fail("no eval line in: " + out)
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def parse_sample(out):
    prompt = re.search(r"^prompt ids: (.*)$", out, re.M)
    ids = re.search(r"^ids: (.*)$", out, re.M)
    if not prompt or not ids:
        fail("no ids lines in l2l-sample output: " + out)
    text = re.search(r"^---- sample .*?----\n(.*)\n---- end of sample", out, re.S | re.M)
    return ([int(x) for x in prompt.group(1).split()], [int(x) for x in ids.group(1).split()],
            text.group(1) if text else None)


def hf_windows_loss(model, toks, T, mask=None):
    """Token-weighted mean cross entropy over the in-order windows of T+1 tokens."""
    W = (len(toks) - 1) // T
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for k in range(W):
            x = torch.tensor([toks[k * T:k * T + T]])
            y = torch.tensor(toks[k * T + 1:k * T + T + 1])
            logits = model(input_ids=x).logits.float()[0].double()
            nll = torch.nn.functional.cross_entropy(logits, y, reduction="none")
            if mask is not None:
                keep = torch.tensor([bool(mask[k * T + 1 + j]) for j in range(T)])
                nll = nll[keep]
            total += nll.sum().item()
            count += nll.numel()
    return total / count, count


def check_close(what, ours, theirs, rel):
    r = abs(ours - theirs) / max(abs(theirs), 1e-12)
    print(f"   {what}: l2l {ours:.7f} transformers {theirs:.7f} rel {r:.2e} (<= {rel:g})")
    if not (r <= rel):
        fail(f"{what}: l2l {ours} vs transformers {theirs}, rel {r:.3e} > {rel}")


def hf_greedy(model, prompt, n, eos):
    model.eval()
    with torch.no_grad():
        # synced_gpus=False: otherwise generate imports torch.distributed.fsdp, broken on torch 1.13 + Python 3.11.
        out = model.generate(torch.tensor([prompt]), do_sample=False, synced_gpus=False, max_new_tokens=n, eos_token_id=eos,
                             pad_token_id=eos, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        # The smallest top-1 / top-2 logit gap along the greedy path (how robust the match is).
        logits = model(input_ids=out[:, :-1]).logits[0, len(prompt) - 1:]
        top2 = torch.topk(logits, 2, dim=-1).values
        gap = (top2[:, 0] - top2[:, 1]).min().item()
    return [int(x) for x in out[0, len(prompt):]], gap


def debian_text():
    parts = []
    for p in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
              "/usr/share/common-licenses/LGPL-2.1"]:
        if os.path.exists(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    if not parts:
        fail("no Debian license texts under /usr/share/common-licenses")
    return "\n".join(parts)


# ---- synthetic: (a) eval, (b) greedy sample, (d) bad inputs ---------------------------------

def make_model_dir(work):
    text = debian_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    d = os.path.join(work, "llama-tiny")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": EOS, "model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    V, eos = tok.get_vocab_size(), tok.token_to_id(EOS)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=eos)
    model = transformers.LlamaForCausalLM(cfg).float()
    model.save_pretrained(d, safe_serialization=True)
    return d, model, tok, eos


def synthetic(bin_dir, work):
    ev, sample, tokenize = (os.path.join(bin_dir, n) for n in ("l2l-eval", "l2l-sample", "l2l-tokenize"))
    d, model, tok, eos = make_model_dir(work)
    # Data: another Debian text, tokenized by l2l-tokenize with the model dir's tokenizer.
    txt = os.path.join(work, "held_out.txt")
    with open("/usr/share/common-licenses/GPL-2", encoding="utf-8", errors="replace") as f:
        open(txt, "w").write(f.read()[:6000])
    data = os.path.join(work, "held_out.bin")
    run([tokenize, txt, data, "--tokenizer", d])
    toks = read_tokens(data)
    if toks != tok.encode(open(txt).read()).ids:
        fail("l2l-tokenize's ids differ from the tokenizers package's (tokenizer under test elsewhere)")
    print(f"(a) l2l-eval on a random LlamaForCausalLM, {len(toks)} tokens")
    n = 700
    for T, B in [(32, 3), (128, 4)]:
        loss, ppl, count = parse_eval(run([ev, "--model", d, "--data", data, "--tokens", str(n), "--context", str(T),
                                           "--batch", str(B)]).stdout)
        want, want_count = hf_windows_loss(model, toks[:n], T)
        if count != want_count:
            fail(f"l2l-eval scored {count} tokens, expected {want_count}")
        check_close(f"loss T={T} B={B}", loss, want, 1e-5)
        check_close(f"perplexity T={T}", ppl, math.exp(want), 1e-4)
    # Default context: min(seq_len=128, 1024) over all tokens.
    loss, _, count = parse_eval(run([ev, "--model", d, "--data", data]).stdout)
    want, want_count = hf_windows_loss(model, toks, 128)
    if count != want_count:
        fail(f"l2l-eval (defaults) scored {count} tokens, expected {want_count}")
    check_close("loss, default context and all tokens", loss, want, 1e-5)
    # A loss mask beside the tokens: only targets with mask 1 count.
    masked = os.path.join(work, "masked.bin")
    write_tokens(masked, toks[:n])
    rng = np.random.default_rng(3)
    mask = [int(x) for x in (rng.random(n) < 0.4)]
    write_mask(masked + ".mask", mask)
    loss, _, count = parse_eval(run([ev, "--model", d, "--data", masked, "--context", "32", "--batch", "2"]).stdout)
    want, want_count = hf_windows_loss(model, toks[:n], 32, mask)
    if count != want_count:
        fail(f"l2l-eval with a mask scored {count} tokens, expected {want_count}")
    check_close("loss with a loss mask", loss, want, 1e-5)

    print("(b) greedy l2l-sample vs HF generate, 32 tokens")
    prompt_text = "This program is free software"
    out = run([sample, d, "--prompt", prompt_text, "--temperature", "0", "--tokens", "32", "--ids"]).stdout
    prompt, ids, text = parse_sample(out)
    if prompt != tok.encode(prompt_text).ids:
        fail(f"l2l-sample's prompt ids {prompt} differ from the tokenizer's {tok.encode(prompt_text).ids}")
    want, gap = hf_greedy(model, prompt, 32, eos)
    print(f"   l2l {ids}\n   HF  {want} (smallest top-2 logit gap {gap:.4f})")
    if ids != want:
        fail("greedy ids differ from HF generate")
    if text != tok.decode(prompt + ids, skip_special_tokens=False):
        fail(f"l2l-sample's text {text!r} is not the decoding of its ids {tok.decode(prompt + ids)!r}")
    # --prompt-ids gives the same, and sampling with top-k / top-p / temperature runs.
    out2 = run([sample, d, "--prompt-ids", ",".join(map(str, prompt)), "--temperature", "0", "--tokens", "32",
                "--ids"]).stdout
    if parse_sample(out2)[1] != ids:
        fail("--prompt-ids greedy differs from --prompt greedy")
    s1 = parse_sample(run([sample, d, "--prompt", prompt_text, "--temperature", "0.9", "--top-k", "50", "--top-p",
                           "0.9", "--seed", "7", "--tokens", "24", "--ids"]).stdout)[1]
    s2 = parse_sample(run([sample, d, "--prompt", prompt_text, "--temperature", "0.9", "--top-k", "50", "--top-p",
                           "0.9", "--seed", "7", "--tokens", "24", "--ids"]).stdout)[1]
    if s1 != s2 or not s1 or any(t < 0 or t >= tok.get_vocab_size() for t in s1):
        fail(f"sampling is not deterministic from its seed or gave bad ids: {s1} / {s2}")

    print("(d) bad inputs")
    def refused(args, needles):
        p = run(args, expect_ok=False)
        err = p.stderr.strip()
        if p.returncode == 0:
            fail(f"{' '.join(args)} succeeded; expected an error naming {needles}")
        if len(err.splitlines()) != 1 or not all(s in err for s in needles):
            fail(f"{' '.join(args)}: expected one line naming {needles}, got: {err!r}")
        print(f"   refused: {err}")
    missing = os.path.join(work, "no-such-model")
    refused([ev, "--model", missing, "--data", data], [missing])
    refused([sample, missing, "--tokens", "2"], [missing])
    refused([ev, "--checkpoint", missing, "--data", data], [missing])
    bad = os.path.join(work, "bad_ids.bin")
    write_tokens(bad, toks[:50] + [tok.get_vocab_size()] + toks[50:60])
    refused([ev, "--model", d, "--data", bad], [bad, str(tok.get_vocab_size())])
    refused([ev, "--model", d, "--data", data, "--context", "129"], ["--context", "129", "seq_len", "128"])
    refused([ev, "--model", d, "--data", os.path.join(work, "no-such-data.bin")], ["no-such-data.bin"])
    refused([sample, d, "--prompt-ids", f"1,{tok.get_vocab_size()}"], ["--prompt-ids", str(tok.get_vocab_size())])
    print("OK")


# ---- the real SmolLM2-135M GGUF --------------------------------------------------------------

def load_gguf_model(path):
    """transformers' GGUF loader (config and dequantized fp32 tensors, as tests/import does).
    A GGUF without output.weight has a tied head (llama.cpp writes no copy of it), which
    transformers 4.46's config conversion does not say: tie it here."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    if "output.weight" not in names:
        cfg.tie_word_embeddings = True
    m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    tensors = load_gguf_checkpoint(path, return_tensors=True)["tensors"]
    res = m.load_state_dict(tensors, strict=False)
    missing = [k for k in res.missing_keys if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or res.unexpected_keys:
        fail(f"{path}: transformers' GGUF loader: missing {missing}, unexpected {res.unexpected_keys}")
    if cfg.tie_word_embeddings:
        m.tie_weights()
    return m.float()


def smollm2(bin_dir, work, gguf_path):
    import gguf
    ev, sample, tokenize = (os.path.join(bin_dir, n) for n in ("l2l-eval", "l2l-sample", "l2l-tokenize"))
    txt = os.path.join(work, "gpl3.txt")
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        open(txt, "w").write(f.read()[:8000])
    data = os.path.join(work, "gpl3.bin")
    run([tokenize, txt, data, "--tokenizer", gguf_path])
    toks = read_tokens(data)
    n = 513  # one window of 512 targets
    if len(toks) < n:
        fail(f"{data}: only {len(toks)} tokens")
    out = run([ev, "--model", gguf_path, "--data", data, "--tokens", str(n)]).stdout
    print("   " + out.strip())
    loss, ppl, count = parse_eval(out)
    model = load_gguf_model(gguf_path)
    want, want_count = hf_windows_loss(model, toks[:n], 512)
    if count != want_count:
        fail(f"l2l-eval scored {count} tokens, expected {want_count}")
    print(f"   perplexity on {count} tokens of GPL-3: l2l {ppl:.4f} transformers {math.exp(want):.4f}")
    check_close("SmolLM2 loss", loss, want, 1e-3)
    check_close("SmolLM2 perplexity", ppl, math.exp(want), 1e-3)
    r = gguf.GGUFReader(gguf_path)
    f = r.fields["tokenizer.ggml.eos_token_id"]
    eos = int(f.parts[f.data[0]][0])
    out = run([sample, gguf_path, "--prompt", "The GNU General Public License is", "--temperature", "0",
               "--tokens", "16", "--ids"]).stdout
    prompt, ids, text = parse_sample(out)
    want_ids, gap = hf_greedy(model, prompt, 16, eos)
    print(f"   greedy l2l {ids}\n   greedy HF  {want_ids} (smallest top-2 logit gap {gap:.4f})\n   text: {text!r}")
    if ids != want_ids:
        fail("SmolLM2 greedy ids differ from HF generate")
    print("OK")


if __name__ == "__main__":
    bin_dir, work, what = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    if what == "synthetic":
        synthetic(bin_dir, work)
    elif what == "smollm2":
        smollm2(bin_dir, work, sys.argv[4])
    else:
        fail("unknown mode " + what)
