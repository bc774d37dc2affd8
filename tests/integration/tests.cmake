# tests/integration: real l2l-eps and l2l-worker processes on loopback (harness.{h,cc}).
# Included from tests/CMakeLists.txt inside l2l_add_test_module(integration ...), after the
# l2l_integration_tests target was created from tests/integration/*_test.cc.
if(TARGET l2l_integration_tests)
  target_sources(l2l_integration_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/integration/harness.cc)
  # The tests exec these binaries: build them with the test binary.
  add_dependencies(l2l_integration_tests l2l-eps l2l-worker l2l-train-ref)
  # eval_test.cc checks in-job validation against l2l-eval and reads `l2lctl watch`.
  add_dependencies(l2l_integration_tests l2l-eval l2lctl)
endif()
include(${CMAKE_CURRENT_SOURCE_DIR}/integration/ops.cmake OPTIONAL)
include(${CMAKE_CURRENT_SOURCE_DIR}/integration/chaos.cmake OPTIONAL)
include(${CMAKE_CURRENT_SOURCE_DIR}/integration/cli.cmake)
# integration.lora_daemon_export (label lora_daemon): a LoRA job through the real daemon
# and a CPU worker on a tiny random Llama saved by transformers, then `l2lctl export
# --format peft | gguf-lora | hf --merge | safetensors --merge`, checked with transformers
# + peft 0.13.2 and the gguf package (tests/integration/lora_daemon_export.py); also
# `ctest -L lora_daemon`.
l2l_add_oracle_test(integration.lora_daemon_export SCRIPT integration/lora_daemon_export.py
                    WORKDIR lora_daemon_export
                    ARGS "'$<TARGET_FILE_DIR:l2l-eps>'" @WORKDIR@
                    LABELS "integration;oracle;lora_daemon" TIMEOUT 900)
