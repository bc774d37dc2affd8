# tests/formats extras (included from tests/CMakeLists.txt inside l2l_add_test_module, so
# CMAKE_CURRENT_SOURCE_DIR is tests/).
#
# formats.lora_export_oracle (label "unit;oracle"): common/formats/lora_export.h (a LoRA
# job's export) against transformers + peft 0.13.2 and the gguf package:
# l2l_lora_export_dump writes PEFT dirs (with modules_to_save lm_head), merged HF dirs and
# safetensors, and a GGUF LoRA from LoRA layers over tiny random Llama / GPT-2 models;
# tests/formats/lora_export_oracle.py loads them with PeftModel.from_pretrained (no missing
# or unexpected keys), compares its logits with transformers' on the merged dir and its
# loss with l2l-eval --adapter (rel <= 1e-5). The interpreter comes from
# scripts/oracle_venv.sh: a missing venv fails the test.
add_executable(l2l_lora_export_dump ${CMAKE_CURRENT_SOURCE_DIR}/formats/lora_export_dump.cc)
target_link_libraries(l2l_lora_export_dump PRIVATE l2l_pretrained l2l_formats CLI11::CLI11)
l2l_add_oracle_test(formats.lora_export_oracle SCRIPT formats/lora_export_oracle.py WORKDIR lora_export_oracle
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" "'$<TARGET_FILE:l2l_lora_export_dump>'" @WORKDIR@
                    LABELS unit oracle TIMEOUT 600)
