#include "server/common/filesystem_info.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace ftd::server {
namespace {

TEST(DescribeFilesystem, NamesTheMountAndTheFreeSpaceOfADirectory) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string d = DescribeFilesystem(dir);
  EXPECT_NE(d.find("filesystem "), std::string::npos) << d;
  EXPECT_NE(d.find(" mounted on /"), std::string::npos) << d;
  EXPECT_NE(d.find(" free"), std::string::npos) << d;
}

TEST(DescribeFilesystem, IsEmptyForAPathThatDoesNotExist) {
  EXPECT_EQ(DescribeFilesystem("/nonexistent/ftd-filesystem-info-test"), "");
}

}  // namespace
}  // namespace ftd::server
