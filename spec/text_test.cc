#include "spec/text.h"

#include <gtest/gtest.h>

namespace ftd::spec {
namespace {

TEST(FindControlChar, FindsC0DelAndC1ButNotOtherText) {
  EXPECT_FALSE(FindControlChar("lr-sweep 1 ünïcode ✓ 日本").has_value());
  auto c = FindControlChar("ok\nforged");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->offset, 2u);
  EXPECT_EQ(c->code, 0x0Au);
  EXPECT_EQ(FindControlChar(std::string_view("a\0b", 3))->code, 0u);
  EXPECT_EQ(FindControlChar("x\x7f")->code, 0x7Fu);
  EXPECT_EQ(FindControlChar("x\xc2\x9b" "2J")->code, 0x9Bu);  // U+009B, CSI
  EXPECT_FALSE(FindControlChar("\xc2\xa0").has_value());     // U+00A0 is printable
  EXPECT_FALSE(FindControlChar("\x9b").has_value());          // not UTF-8: checked elsewhere
}

TEST(CheckNoControlChars, NamesTheFieldTheCharacterAndTheFix) {
  EXPECT_TRUE(CheckNoControlChars("plain name", "name").ok());
  auto st = CheckNoControlChars("run\x1b]0;owned\a", "name");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "name holds a control character (U+001B, an escape, at byte 3): text fields take printable text only; "
            "remove it");
  st = CheckNoControlChars(std::string("data.bin\0/../../etc/shadow", 26), "spec.data.path");
  EXPECT_EQ(st.message(),
            "spec.data.path holds a NUL byte (U+0000, a NUL, at byte 8): a path cannot hold one; remove it");
  EXPECT_NE(CheckNoControlChars("a\tb", "request_id").message().find("U+0009, a tab"), std::string::npos);
}

TEST(EscapeControl, WritesControlsAndBadBytesVisiblyAndKeepsTheRest) {
  EXPECT_EQ(EscapeControl("job j-1 done: ok"), "job j-1 done: ok");
  EXPECT_EQ(EscapeControl("a\nftd: forged line"), "a\\nftd: forged line");
  EXPECT_EQ(EscapeControl("\x1b]0;owned\a\x1b[2J"), "\\x1b]0;owned\\x07\\x1b[2J");
  EXPECT_EQ(EscapeControl("\r\t\x7f"), "\\r\\t\\x7f");
  EXPECT_EQ(EscapeControl("\xc2\x9b" "2J"), "\\u009b2J");
  EXPECT_EQ(EscapeControl("bad \xff\xfe byte"), "bad \\xff\\xfe byte");
  EXPECT_EQ(EscapeControl("ünïcode ✓"), "ünïcode ✓");
  EXPECT_EQ(EscapeControl("line 1\n\tline 2\x1b[1m\n", "\n\t"), "line 1\n\tline 2\\x1b[1m\n");
}

}  // namespace
}  // namespace ftd::spec
