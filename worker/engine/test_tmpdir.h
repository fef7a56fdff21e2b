// A fresh, empty directory per test for the engine's file tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace ftd::engine {

inline std::filesystem::path TempDir() {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("ftd-test-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace ftd::engine
