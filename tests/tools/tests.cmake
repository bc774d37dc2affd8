# l2l-eval and l2l-sample against Hugging Face transformers (label "unit;oracle"; included
# from tests/CMakeLists.txt inside l2l_add_test_module, so CMAKE_CURRENT_SOURCE_DIR is
# tests/). tools.hf_oracle: a random LlamaForCausalLM saved by transformers with a
# byte-level BPE tokenizer trained here: eval loss (with and without a loss mask) rel <=
# 1e-5, greedy ids for 32 tokens equal generate's, bad inputs refused in one line.
# tools.smollm2: the real SmolLM2-135M GGUF (scripts/fetch_models.sh; a failed fetch fails
# the test): perplexity on 512 tokens of GPL-3 vs transformers' GGUF loader rel <= 1e-3,
# greedy ids for 16 tokens equal. The interpreter comes from scripts/oracle_venv.sh: a
# missing venv fails.
set(_tools_dir ${CMAKE_CURRENT_BINARY_DIR}/tools_oracle)
add_test(NAME tools.hf_oracle
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_tools_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/tools/tools_oracle.py' '$<TARGET_FILE_DIR:l2l-eval>' '${_tools_dir}' synthetic")
set_tests_properties(tools.hf_oracle PROPERTIES LABELS "unit;oracle" TIMEOUT 600)
set(_tools_real ${CMAKE_CURRENT_BINARY_DIR}/tools_smollm2)
add_test(NAME tools.smollm2
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); G=$('${CMAKE_SOURCE_DIR}/scripts/fetch_models.sh' smollm2); rm -rf '${_tools_real}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/tools/tools_oracle.py' '$<TARGET_FILE_DIR:l2l-eval>' '${_tools_real}' smollm2 \"$G\"")
set_tests_properties(tools.smollm2 PROPERTIES LABELS "integration;oracle" TIMEOUT 1200)
# tools.encoder_oracle: l2l-eval on random BertForSequenceClassification (2 and 3 labels)
# and BertForMaskedLM models saved by transformers: loss, accuracy, F1 and the masked-LM
# metrics against HF's logits (tests/tools/encoder_oracle.py). tools.minilm: the real
# all-MiniLM-L6-v2 (scripts/fetch_models.sh minilm; a failed fetch fails the test, it never
# skips): l2l-tokenize rows equal HF's tokenizer and l2l-embed's mean-pooled embeddings equal
# HF AutoModel's (rel <= 1e-5) on 100 sentences, with and without the "bert." prefix.
set(_enc_dir ${CMAKE_CURRENT_BINARY_DIR}/encoder_oracle)
add_test(NAME tools.encoder_oracle
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_enc_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/tools/encoder_oracle.py' '$<TARGET_FILE_DIR:l2l-eval>' '${_enc_dir}' eval")
set_tests_properties(tools.encoder_oracle PROPERTIES LABELS "unit;oracle" TIMEOUT 600)
set(_minilm_dir ${CMAKE_CURRENT_BINARY_DIR}/encoder_minilm)
add_test(NAME tools.minilm
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); M=$('${CMAKE_SOURCE_DIR}/scripts/fetch_models.sh' minilm); rm -rf '${_minilm_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/tools/encoder_oracle.py' '$<TARGET_FILE_DIR:l2l-eval>' '${_minilm_dir}' minilm \"$M\"")
set_tests_properties(tools.minilm PROPERTIES LABELS "integration;oracle" TIMEOUT 1200)
# tools.bert_finetune: scripts/finetune_bert_demo.sh, shortened to 30 relay steps: the real
# all-MiniLM-L6-v2 fine-tuned as a 4-class licence classifier through l2l-eps + one CPU
# worker must end at least 0.2 above the majority class on held-out chunks, and its HF
# export must load in transformers with l2l-eval's logits. Several minutes on 2 cores.
add_test(NAME tools.bert_finetune
         COMMAND bash -c
                 "set -e; rm -rf '${CMAKE_CURRENT_BINARY_DIR}/bert_finetune'; BERT_DEMO_STEPS=30 BERT_DEMO_OUT='${CMAKE_CURRENT_BINARY_DIR}/bert_finetune' L2L_BUILD_DIR='${CMAKE_BINARY_DIR}' bash '${CMAKE_SOURCE_DIR}/scripts/finetune_bert_demo.sh'")
set_tests_properties(tools.bert_finetune PROPERTIES LABELS "integration;oracle" TIMEOUT 1800)
