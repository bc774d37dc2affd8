# tests/integration/cli.cmake: `l2l`, the front door (cli/), end to end with the real
# programs (l2l_cli_test.py). Included from tests/integration/tests.cmake.
if(TARGET l2l_integration_tests)
  add_dependencies(l2l_integration_tests l2l)
endif()
find_program(L2L_CLI_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(L2L_CLI_PYTHON)
  add_test(NAME l2l_cli
           COMMAND ${L2L_CLI_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/l2l_cli_test.py
                   ${CMAKE_BINARY_DIR}/bin ${CMAKE_CURRENT_BINARY_DIR}/l2l_cli_work)
  set_tests_properties(l2l_cli PROPERTIES LABELS "integration" TIMEOUT 900)
else()
  message(FATAL_ERROR "l2l: /usr/bin/python3 not found: the l2l_cli test needs it (scripts/setup.sh installs it)")
endif()
