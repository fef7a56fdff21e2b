// main() of every gtest executable (cmake/FtdTests.cmake): runs the tests, then tells ctest what
// happened through the exit code: 77 when every test skipped (ctest shows "Skipped", not "Passed"),
// and a failure when any test skipped while FTD_TEST_NO_SKIP is set (scripts/gpu.sh: on a GPU machine
// a GPU test must not skip).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kSkippedExitCode = 77;  // SKIP_RETURN_CODE in cmake/FtdTests.cmake

bool NoSkipsAllowed() {
  const char* v = std::getenv("FTD_TEST_NO_SKIP");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  const int skipped = u.skipped_test_count();
  if (skipped > 0 && NoSkipsAllowed()) {
    std::fprintf(stderr, "%d test(s) skipped with FTD_TEST_NO_SKIP set: counted as a failure\n", skipped);
    return 1;
  }
  if (rc == 0 && skipped > 0 && skipped == u.test_to_run_count()) return kSkippedExitCode;
  return rc;
}
