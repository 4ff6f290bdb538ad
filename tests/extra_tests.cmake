# The installation test: install into a temporary prefix, build and run a consumer through
# pkg-config and through find_package(sdpa) (tests/install/).
add_test(NAME install COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install/run_install_test.sh
                              ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(install PROPERTIES LABELS no-sanitizer)
# Every C file of the tree must match .clang-format.
add_test(NAME format_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/format_check.sh
                                   ${PROJECT_SOURCE_DIR})
set_tests_properties(format_check PROPERTIES LABELS no-sanitizer)
# test_golden reads the PyTorch fixtures from the source tree (tests/golden/README.md).
if(TARGET test_golden)
  target_compile_definitions(test_golden PRIVATE SDPA_GOLDEN_DIR="${CMAKE_CURRENT_SOURCE_DIR}/golden")
endif()
# `sdpa bench` runs a tiny shape and writes JSON that parses (tests/test_bench.sh; no timings).
if(SDPA_BUILD_CLI)
  add_test(NAME test_bench COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_bench.sh $<TARGET_FILE:sdpa>)
endif()
