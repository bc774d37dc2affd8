# tests/integration/ops.cmake (engineer "ops"): operating l2l as a service.
# Included at the end of tests/integration/tests.cmake (inside l2l_add_test_module, so
# CMAKE_CURRENT_SOURCE_DIR is tests/).
#  * ctl_test.cc / sd_notify_test.cc exec build/bin/l2lctl and l2l-eps: build them first.
#  * plot_test: writes a small run.jsonl with RunLog (l2l_ops_runlog_writer), runs
#    scripts/plot_run.py on it with /usr/bin/python3 (the interpreter with matplotlib)
#    and checks the PNG (signature, IHDR size, plausible file size).
if(TARGET l2l_integration_tests)
  add_dependencies(l2l_integration_tests l2lctl l2l-eps)
endif()

add_executable(l2l_ops_runlog_writer ${CMAKE_CURRENT_SOURCE_DIR}/integration/runlog_writer.cc)
target_link_libraries(l2l_ops_runlog_writer PRIVATE l2l_eps)
find_program(L2L_SYSTEM_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(L2L_SYSTEM_PYTHON)
  add_test(NAME plot_test
           COMMAND ${L2L_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/plot_test.py
                   $<TARGET_FILE:l2l_ops_runlog_writer> ${CMAKE_SOURCE_DIR}/scripts/plot_run.py)
  set_tests_properties(plot_test PROPERTIES LABELS "integration" TIMEOUT 120)
else()
  message(WARNING "l2l: /usr/bin/python3 not found; plot_test is not registered")
endif()
