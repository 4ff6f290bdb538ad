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
# The committed fuzz corpora replayed through the fuzz targets with a plain main()
# (tests/fuzz/replay.c), so every build, the ASan one included, runs them without libFuzzer.
# `make fuzz` runs the same targets under libFuzzer.
if(SDPA_BUILD_CLI)
  foreach(t npy_header npy_load)
    add_executable(fuzz_replay_${t} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay.c
                   ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_${t}.c)
    target_link_libraries(fuzz_replay_${t} PRIVATE sdpa_cli_io)
    target_compile_options(fuzz_replay_${t} PRIVATE ${SDPA_WARNINGS})
    add_test(NAME fuzz_replay_${t} COMMAND fuzz_replay_${t} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${t})
  endforeach()
endif()
# `sdpa explain` shows the seeds' numbers, fits 80 columns, and fails cleanly (test_explain.sh).
if(SDPA_BUILD_CLI)
  add_test(NAME test_explain COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_explain.sh $<TARGET_FILE:sdpa>)
endif()
# The API fuzz target (tests/fuzz/fuzz_api.c: sdpa_forward and sdpa_weights on fuzzed
# arguments, checked against the reference) replayed over its committed corpus with the plain
# main() of tests/fuzz/replay.c; tests/fuzz/run_api_fuzz.sh runs it under libFuzzer.
add_executable(fuzz_replay_api ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay.c
               ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_api.c ${CMAKE_CURRENT_SOURCE_DIR}/testutil.c)
target_include_directories(fuzz_replay_api PRIVATE ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(fuzz_replay_api PRIVATE sdpa_static)
target_compile_options(fuzz_replay_api PRIVATE ${SDPA_WARNINGS})
add_test(NAME fuzz_replay_api COMMAND fuzz_replay_api ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/api)
