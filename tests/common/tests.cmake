# tests/common extras (included from tests/CMakeLists.txt inside l2l_add_test_module, so
# CMAKE_CURRENT_SOURCE_DIR is tests/): independent Python checks of our file formats.
add_executable(l2l_format_tool ${CMAKE_CURRENT_SOURCE_DIR}/common/format_tool.cc)
target_link_libraries(l2l_format_tool PRIVATE l2l_formats)
add_test(NAME common.formats.safetensors_python
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/common/check_formats.py safetensors
                 $<TARGET_FILE:l2l_format_tool>)
add_test(NAME common.formats.tokenize_python
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/common/check_formats.py tokenize
                 $<TARGET_FILE:l2l-tokenize>)
set_tests_properties(common.formats.safetensors_python common.formats.tokenize_python
                     PROPERTIES LABELS "unit" TIMEOUT 120)
# The analytic multi-device relay model behind `l2l-bench-relay --simulate`, checked by
# its properties (monotone in devices with bandwidth-centric fetch, fraction 0 = none).
add_test(NAME common.relay_model.simulate
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/common/check_simulate.py
                 $<TARGET_FILE:l2l-bench-relay>)
set_tests_properties(common.relay_model.simulate PROPERTIES LABELS "unit" TIMEOUT 120)
