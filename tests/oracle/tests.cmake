# PyTorch oracle (label "unit;oracle"): l2l-oracle-dump writes a tiny GPT's weights,
# tokens, our probabilities, loss, gradients and one AdamW step (tied and untied
# embeddings); tests/oracle/torch_oracle.py recomputes them with plain torch
# (/usr/bin/python3 with python3-torch from scripts/setup.sh) and compares. A missing
# torch makes the test fail, never skip. Included from tests/CMakeLists.txt inside
# l2l_add_test_module, so CMAKE_CURRENT_SOURCE_DIR is tests/.
set(_oracle_dir ${CMAKE_CURRENT_BINARY_DIR}/oracle_dump)
add_test(NAME oracle.torch_reference
         COMMAND bash -c
                 "set -e; rm -rf '${_oracle_dir}'; '$<TARGET_FILE:l2l-oracle-dump>' --out '${_oracle_dir}'; /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/oracle/torch_oracle.py' '${_oracle_dir}'")
set_tests_properties(oracle.torch_reference PROPERTIES LABELS "unit;oracle" TIMEOUT 300)

# Hugging Face transformers oracle (label "unit;oracle"): l2l-oracle-dump --hf writes
# GPT-2, Llama (GQA/MQA/MHA, tied and untied, llama3 and linear rope scaling), Qwen2
# (q/k/v biases), Mistral, Mixtral (mixture of experts with and without the load-balancing
# loss, an expert starved of tokens; three AdamW steps with .grad None for idle experts),
# BertForMaskedLM and BertForSequenceClassification (token
# types, padded sequences) variants; tests/oracle/hf_oracle.py loads each into the
# transformers class with from_pretrained and compares loss, every gradient and one AdamW
# step. The interpreter comes from scripts/oracle_venv.sh: a missing venv fails the test.
set(_hf_oracle_dir ${CMAKE_CURRENT_BINARY_DIR}/hf_oracle_dump)
add_test(NAME oracle.hf_transformers
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_hf_oracle_dir}'; '$<TARGET_FILE:l2l-oracle-dump>' --hf --out '${_hf_oracle_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/oracle/hf_oracle.py' '${_hf_oracle_dir}'")
set_tests_properties(oracle.hf_transformers PROPERTIES LABELS "unit;oracle" TIMEOUT 600)

# Hugging Face PEFT oracle for LoRA (label "unit;oracle"): l2l-oracle-dump --lora writes
# LoRA variants (Llama GQA untied with all-linear targets and lm_head in modules_to_save,
# GPT-2 tied with its Conv1D c_attn / c_proj / c_fc, Llama with a bf16 base and three
# targets); tests/oracle/peft_oracle.py wraps the transformers model with
# peft.get_peft_model, loads our adapters and compares loss, the adapters' gradients and
# one AdamW step. The interpreter comes from scripts/oracle_venv.sh (peft pinned there).
set(_peft_oracle_dir ${CMAKE_CURRENT_BINARY_DIR}/peft_oracle_dump)
add_test(NAME oracle.peft_lora
         COMMAND bash -c
                 "set -e; PY=$('${CMAKE_SOURCE_DIR}/scripts/oracle_venv.sh'); rm -rf '${_peft_oracle_dir}'; '$<TARGET_FILE:l2l-oracle-dump>' --lora --out '${_peft_oracle_dir}'; HF_HUB_OFFLINE=1 \"$PY\" '${CMAKE_CURRENT_SOURCE_DIR}/oracle/peft_oracle.py' '${_peft_oracle_dir}'")
set_tests_properties(oracle.peft_lora PROPERTIES LABELS "unit;oracle" TIMEOUT 600)
