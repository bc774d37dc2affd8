"""Oracle test of l2l-eval / l2l-sample --adapter DIR against transformers + peft.

  adapter_oracle.py BIN_DIR WORK_DIR

For a tiny random LlamaForCausalLM and GPT2LMHeadModel (tests/formats/lora_oracle.py
make-base) and a LoRA adapter made and saved by peft 0.13.2 itself (random A and B, every
linear of the blocks targeted): (a) l2l-eval --model BASE --adapter ADAPTER gives the loss
of l2l-eval --model MERGED, where MERGED is peft's merge_and_unload() saved as a Hugging
Face dir, and of transformers on MERGED, rel <= 1e-5; the adapter moves the loss (rel
> 1e-3, so a skipped merge fails); (b) greedy l2l-sample ids with --adapter equal those of
the merged model; (c) adapters that do not fit the model are refused in one line naming
the module (a GPT-2 adapter on the Llama, a lora_B with one row less) and a missing
directory is refused. Exits non-zero with a message on the first failure. Run with the
oracle venv's python (scripts/oracle_venv.sh) and HF_HUB_OFFLINE=1.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "formats"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import lora_oracle  # noqa: E402
from tools_oracle import check_close, fail, hf_windows_loss, parse_eval, parse_sample, run, write_tokens  # noqa: E402

TARGETS = {"llama": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "gpt2": "c_attn,c_proj,c_fc"}


def quiet(fn, *args):
    """lora_oracle's helpers print one "ok" line each; keep the log readable."""
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        fn(*args)


def family_case(bin_dir, work, family):
    print(f"-- {family}")
    base, adapter, merged = (os.path.join(work, family + s) for s in ("-base", "-adapter", "-merged"))
    quiet(lora_oracle.make_base, family, base)
    quiet(lora_oracle.peft_save, base, TARGETS[family], adapter)
    quiet(lora_oracle.merge_save, base, adapter, merged)
    g = np.random.default_rng(4)
    toks = [int(x) for x in g.integers(0, 128, size=257)]
    data = os.path.join(work, family + ".tokens")
    write_tokens(data, toks)
    ev = os.path.join(bin_dir, "l2l-eval")
    T = 32
    with_adapter = parse_eval(run([ev, "--model", base, "--adapter", adapter, "--data", data, "--context", str(T)]).stdout)
    of_merged = parse_eval(run([ev, "--model", merged, "--data", data, "--context", str(T)]).stdout)
    of_base = parse_eval(run([ev, "--model", base, "--data", data, "--context", str(T)]).stdout)
    hf_loss, _ = hf_windows_loss(transformers.AutoModelForCausalLM.from_pretrained(merged), toks, T)
    check_close("loss with --adapter vs l2l-eval of the merged dir", with_adapter[0], of_merged[0], 1e-5)
    check_close("loss with --adapter vs transformers on the merged dir", with_adapter[0], hf_loss, 1e-5)
    moved = abs(with_adapter[0] - of_base[0]) / of_base[0]
    print(f"   the adapter moves the loss by rel {moved:.3g}")
    if not moved > 1e-3:
        fail(f"the adapter hardly changes the loss ({moved:.3g}): a skipped merge would pass")

    sm = os.path.join(bin_dir, "l2l-sample")
    common = ["--prompt-ids", "5,17,99,3", "--temperature", "0", "--tokens", "12", "--ignore-eos", "--ids"]
    _, ids_adapter, _ = parse_sample(run([sm, base, "--adapter", adapter] + common).stdout)
    _, ids_merged, _ = parse_sample(run([sm, merged] + common).stdout)
    _, ids_base, _ = parse_sample(run([sm, base] + common).stdout)
    print(f"   greedy ids with --adapter {ids_adapter}, merged {ids_merged}, base {ids_base}")
    if ids_adapter != ids_merged:
        fail("l2l-sample --adapter ids differ from the merged model's")
    return base, adapter


def refused(args, needles):
    p = run(args, expect_ok=False)
    err = p.stderr.strip()
    if p.returncode == 0 or len(err.splitlines()) != 1 or not all(n in err for n in needles):
        fail(f"{' '.join(args)}: expected one error line with {needles}, got rc {p.returncode}: {err}")
    print(f"   refused: {err}")


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    llama_base, llama_adapter = family_case(bin_dir, work, "llama")
    _, gpt2_adapter = family_case(bin_dir, work, "gpt2")

    print("-- mismatches")
    ev = os.path.join(bin_dir, "l2l-eval")
    data = os.path.join(work, "llama.tokens")
    refused([ev, "--model", llama_base, "--adapter", gpt2_adapter, "--data", data],
            ["--adapter", "transformer.h.", "is not a linear weight of this llama model"])
    short = os.path.join(work, "llama-adapter-short")
    os.makedirs(short, exist_ok=True)
    tensors = load_file(os.path.join(llama_adapter, "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
    tensors[key] = np.ascontiguousarray(tensors[key][:-1])
    save_file(tensors, os.path.join(short, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(llama_adapter, "adapter_config.json")) as f, \
            open(os.path.join(short, "adapter_config.json"), "w") as g:
        g.write(f.read())
    refused([ev, "--model", llama_base, "--adapter", short, "--data", data],
            ["model.layers.1.mlp.up_proj has (out, in) (95, 64)", "the model's weight is (out, in) (96, 64)"])
    refused([os.path.join(bin_dir, "l2l-sample"), llama_base, "--adapter", os.path.join(work, "nowhere"),
             "--prompt-ids", "1"], ["no such adapter directory"])
    print("OK")


if __name__ == "__main__":
    main()
