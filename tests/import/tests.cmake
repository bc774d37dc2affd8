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
