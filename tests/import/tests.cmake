# model.from import and export --format hf|gguf, against Hugging Face transformers
# (label "integration;oracle"): tests/import/import_oracle.py drives the real l2l-eps +
# l2l-worker on tiny random Llama / Qwen2 / GPT-2 models saved by transformers (f32,
# sharded, bf16) and GGUF files written by the gguf package (F32, Q8_0), exports after
# training and reloads with transformers, and feeds malformed files. import.smollm2
# imports the real SmolLM2-135M GGUF (scripts/fetch_models.sh; a failed fetch fails the
# test). The interpreter comes from scripts/oracle_venv.sh: a missing venv fails.
set(_import_dir ${CMAKE_CURRENT_BINARY_DIR}/import_oracle)
add_test(NAME import.hf_gguf_oracle
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_import_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/import/import_oracle.py' '$<TARGET_FILE_DIR:l2l-eps>' '${_import_dir}' synthetic")
set_tests_properties(import.hf_gguf_oracle PROPERTIES LABELS "integration;oracle" TIMEOUT 1200)
set(_import_real ${CMAKE_CURRENT_BINARY_DIR}/import_smollm2)
add_test(NAME import.smollm2
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); G=$('${CMAKE_SOURCE_DIR}/scripts/fetch_models.sh' smollm2); rm -rf '${_import_real}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/import/import_oracle.py' '$<TARGET_FILE_DIR:l2l-eps>' '${_import_real}' smollm2 \"$G\"")
set_tests_properties(import.smollm2 PROPERTIES LABELS "integration;oracle" TIMEOUT 1800)
# export --format gguf of HF-dir imports carries the tokenizer (tokenizer.ggml.*): byte-level
# BPE tokenizers with the GPT-2, Llama-3, Qwen2 and SmolLM pre-tokenizers, trained here by
# `tokenizers`; the gguf package reads the metadata back, l2l's GGUF loader encodes varied
# text as HF `tokenizers` does with the original tokenizer.json.
set(_import_tok ${CMAKE_CURRENT_BINARY_DIR}/import_gguf_tokenizer)
add_test(NAME import.gguf_tokenizer
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_import_tok}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/import/import_oracle.py' '$<TARGET_FILE_DIR:l2l-eps>' '${_import_tok}' gguf_tokenizer '$<TARGET_FILE:l2l_tokenizer_tool>'")
set_tests_properties(import.gguf_tokenizer PROPERTIES LABELS "integration;oracle" TIMEOUT 900)
