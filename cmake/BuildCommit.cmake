# Writes OUT, a header defining FTD_COMMIT (the source tree's `git describe --always --dirty`, or
# "unknown" outside a git checkout), only when it changes: run at every build by server/CMakeLists.txt.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
file(WRITE "${OUT}.new" "#pragma once\n#define FTD_COMMIT \"${commit}\"\n")
file(COPY_FILE "${OUT}.new" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.new")
