# model.from import and export --format hf|gguf, against Hugging Face transformers
# (label "integration;oracle"): tests/import/import_oracle.py drives the real l2l-eps +
# l2l-worker on tiny random Llama / Qwen2 / GPT-2 models saved by transformers (f32,
# sharded, bf16) and GGUF files written by the gguf package (F32, Q8_0), exports after
# training and reloads with transformers, and feeds malformed files. import.smollm2
# imports the real SmolLM2-135M GGUF (scripts/fetch_models.sh; a failed fetch fails the
# test). The interpreter comes from scripts/oracle_venv.sh: a missing venv fails.
l2l_add_oracle_test(import.hf_gguf_oracle SCRIPT import/import_oracle.py WORKDIR import_oracle
                    ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@ synthetic
                    LABELS integration oracle TIMEOUT 1200)
l2l_add_oracle_test(import.smollm2 SCRIPT import/import_oracle.py FETCH smollm2 WORKDIR import_smollm2
                    ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@ smollm2 @MODEL@
                    LABELS integration oracle TIMEOUT 1800)
# import.smollm2_bf16_emu (the emulator build only, label emu): the real SmolLM2-135M
# through the CUDA backend's bf16 path (bf16-published layers, bf16 GEMMs, bf16 stash) on
# the CPU emulator of CUDA, within 1e-2 of transformers' fp32 loss.
if(L2L_CUDA_EMULATOR)
  l2l_add_oracle_test(import.smollm2_bf16_emu SCRIPT import/import_oracle.py FETCH smollm2 WORKDIR import_smollm2_bf16
                      ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@ smollm2_bf16 @MODEL@
                      LABELS emu TIMEOUT 1200)
endif()
# import.smollm2_q4_k_m: the real SmolLM2-135M exported with --dtype q4_k_m (llama.cpp's
# Q4_K_M mix: Q4_K/Q6_K, Q5_0/Q8_0 for rows of 576): the gguf package reads it, every
# tensor has the type the recipe gives it, l2l-eval's perplexity on 512 tokens of GPL-3 is
# within 6% of the original Q4_1 file's.
l2l_add_oracle_test(import.smollm2_q4_k_m SCRIPT import/import_oracle.py FETCH smollm2 WORKDIR import_smollm2_q4km
                    ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@ smollm2_q4_k_m @MODEL@
                    LABELS integration oracle TIMEOUT 1800)
# export --format gguf of HF-dir imports carries the tokenizer (tokenizer.ggml.*): byte-level
# BPE tokenizers with the GPT-2, Llama-3, Qwen2 and SmolLM pre-tokenizers, trained here by
# `tokenizers`; the gguf package reads the metadata back, l2l's GGUF loader encodes varied
# text as HF `tokenizers` does with the original tokenizer.json.
l2l_add_oracle_test(import.gguf_tokenizer SCRIPT import/import_oracle.py WORKDIR import_gguf_tokenizer
                    ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@ gguf_tokenizer
                         "'$<TARGET_FILE:l2l_tokenizer_tool>'"
                    LABELS integration oracle TIMEOUT 900)
# The real Gemma 3 270M GGUF (Q4_K_M: K-quant tensors) through l2l-eval against the
# perplexity transformers 4.57 computed of the same file and token ids
# (tests/fixtures/gemma3_270m/reference.json, made by tests/fixtures/make_gemma3_gguf_fixture.py).
# A failed fetch fails the test. /usr/bin/python3 only (no packages).
set(_gemma3_work ${CMAKE_CURRENT_BINARY_DIR}/import_gemma3_gguf)
add_test(NAME import.gemma3_gguf
         COMMAND bash -c "set -e; MODEL=$('${CMAKE_SOURCE_DIR}/scripts/fetch_models.sh' gemma3); rm -rf '${_gemma3_work}'; /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/import/gemma3_gguf_test.py' '$<TARGET_FILE:l2l-eval>' \"$MODEL\" '${_gemma3_work}'")
set_tests_properties(import.gemma3_gguf PROPERTIES LABELS "integration;oracle" TIMEOUT 1200)
# The real Gemma 3 270M GGUF fine-tuned through the relay (`l2l finetune`, 3 steps on Debian's
# licence texts) and exported to GGUF Q4_K_M: the gguf package reads the export back with
# the original file's names, shapes and llama.cpp's Q4_K_M types; the held-out perplexity of
# the export is below the one before. (The HF export loaded by transformers 4.57:
# scripts/gemma3_roundtrip.sh, with the fixtures venv CI does not have.) ~2 min on 2 cores.
l2l_add_oracle_test(import.gemma3_finetune SCRIPT import/gemma3_finetune_test.py FETCH gemma3
                    WORKDIR import_gemma3_finetune
                    ARGS "'$<TARGET_FILE_DIR:l2l>'" @MODEL@ @WORKDIR@
                    LABELS integration oracle TIMEOUT 900)
