# How ftd registers its tests, for the whole build and for kernels/ built on its own.
#
#   ftd_test(NAME [GPU] SOURCES ... LIBS ...)   a gtest executable (main: tests/gtest_main.cc)
#   ftd_pytest(NAME FILE [GPU])                 a pytest file, run from the source root
#
# Both record the files they register (the global property FTD_REGISTERED_TEST_FILES, absolute
# paths); ftd_write_registered_tests() writes them to the build tree for registration_test, which
# fails on any tests/python/test_*.py or *_test.cc that no helper registered.
#
# GPU tests carry the label `gpu` (CPU-only CI runs `ctest -LE gpu`), the others `cpu`. A test whose
# every case skipped (a GPU test where no CUDA device is visible) exits 77, which ctest reports as
# Skipped rather than Passed. With FTD_TEST_NO_SKIP=1 in the environment, any skipped case fails the
# test instead (scripts/gpu.sh sets it: on a GPU machine nothing may skip). The exit code is used, not
# SKIP_REGULAR_EXPRESSION: ctest reports a test whose output matches that expression as skipped even
# when it failed.
include_guard(GLOBAL)
set(FTD_TEST_SKIP_CODE 77)
get_filename_component(FTD_SOURCE_ROOT ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)

function(ftd_test_labels name gpu)
  if(gpu)
    set(label gpu)
  else()
    set(label cpu)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS ${label} SKIP_RETURN_CODE ${FTD_TEST_SKIP_CODE})
endfunction()

function(ftd_test name)
  cmake_parse_arguments(T "GPU" "" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET ftd_gtest_main)
    add_library(ftd_gtest_main STATIC ${FTD_SOURCE_ROOT}/tests/gtest_main.cc)
    target_link_libraries(ftd_gtest_main PUBLIC GTest::gtest)
    ftd_strict(ftd_gtest_main)
  endif()
  foreach(src ${T_SOURCES})
    get_filename_component(abs ${src} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    set_property(GLOBAL APPEND PROPERTY FTD_REGISTERED_TEST_FILES ${abs})
  endforeach()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} ftd_gtest_main GTest::gtest)
  target_include_directories(${name} PRIVATE ${FTD_SOURCE_ROOT})
  ftd_strict(${name})
  add_test(NAME ${name} COMMAND ${name})
  ftd_test_labels(${name} "${T_GPU}")
endfunction()

# pytest suites compare against HF transformers and drive the real binaries; tests/python/conftest.py
# gives the skip exit code and honours FTD_TEST_NO_SKIP.
function(ftd_pytest name file)
  cmake_parse_arguments(P "GPU" "" "" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY FTD_REGISTERED_TEST_FILES ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  add_test(NAME ${name} COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs -p no:cacheprovider
           ${CMAKE_CURRENT_SOURCE_DIR}/${file} WORKING_DIRECTORY ${FTD_SOURCE_ROOT})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "FTD_BUILD_DIR=${PROJECT_BINARY_DIR};PYTHONDONTWRITEBYTECODE=1")
  ftd_test_labels(${name} "${P_GPU}")
endfunction()

# Writes every file the helpers registered, one per line, to `out` (called once all directories are
# configured; registration_test reads it).
function(ftd_write_registered_tests out)
  get_property(files GLOBAL PROPERTY FTD_REGISTERED_TEST_FILES)
  list(REMOVE_DUPLICATES files)
  list(SORT files)
  list(JOIN files "\n" text)
  file(WRITE ${out} "${text}\n")
endfunction()
