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
