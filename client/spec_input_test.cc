#include "client/spec_input.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ftd::client {
namespace {

TEST(SpecInput, FormatFromTheNameElseFromTheText) {
  EXPECT_EQ(DetectSpecFormat("job.yaml", "{}"), SpecFormat::kYaml);
  EXPECT_EQ(DetectSpecFormat("JOB.YML", ""), SpecFormat::kYaml);
  EXPECT_EQ(DetectSpecFormat("job.json", "steps: 1"), SpecFormat::kJson);
  EXPECT_EQ(DetectSpecFormat("stdin", "\n  {\"steps\": 1}"), SpecFormat::kJson);
  EXPECT_EQ(DetectSpecFormat("stdin", "steps: 1\n"), SpecFormat::kYaml);
}

TEST(SpecInput, YamlMapsToTheSameSpecAsJson) {
  const std::string yaml = R"(# a comment
model: {preset: tiny}
data:
  path: train.bin
  shuffle: true
  seed: 18446744073709551615
optimizer:
  lr: 1e-4
steps: 20
device: "cpu"
lora:
  target_modules: [q, v]
kernels: {rmsnorm: eager}
)";
  auto y = ParseSpecText("job.yaml", yaml);
  ASSERT_TRUE(y.ok()) << y.status();
  auto j = ParseSpecText("job.json", R"({"model": {"preset": "tiny"}, "data": {"path": "train.bin", "shuffle": true,
      "seed": 18446744073709551615}, "optimizer": {"lr": 1e-4}, "steps": 20, "device": "cpu",
      "lora": {"target_modules": ["q", "v"]}, "kernels": {"rmsnorm": "eager"}})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(y->SerializeAsString(), j->SerializeAsString());
  EXPECT_EQ(y->optimizer().lr(), 1e-4);
  EXPECT_EQ(y->data().seed(), 18446744073709551615ull);
}

TEST(SpecInput, AQuotedYamlScalarStaysAString) {
  auto y = ParseSpecText("job.yaml", "model: {preset: \"123\"}\n");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->model().preset(), "123");
  auto bad = ParseSpecText("job.yaml", "steps: \"true\"\n");  // a string where a number belongs
  EXPECT_FALSE(bad.ok());
}

TEST(SpecInput, ErrorsNameTheSourceAndWhere) {
  auto syntax = ParseSpecText("job.yaml", "steps: 2\nmodel: [tiny\n");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.status().message().find("job.yaml: spec is not valid YAML: line "), absl::string_view::npos)
      << syntax.status();
  auto json = ParseSpecText("job.json", "{\n  \"steps\": 2\n  \"seq_len\": 8\n}");
  EXPECT_NE(json.status().message().find("job.json: spec is not valid JSON: line 3, column 3"), absl::string_view::npos)
      << json.status();
  auto unknown = ParseSpecText("job.yaml", "stepz: 2\n");
  EXPECT_NE(unknown.status().message().find("stepz"), absl::string_view::npos) << unknown.status();
  auto list = ParseSpecText("stdin", "- steps\n");
  EXPECT_NE(list.status().message().find("mapping"), absl::string_view::npos) << list.status();
  auto empty = ParseSpecText("stdin", "  \n");
  EXPECT_NE(empty.status().message().find("empty"), absl::string_view::npos) << empty.status();
}

// Nine levels of aliases, each repeating the one below nine times: 9^9 values from a few hundred
// bytes. Refused at once, naming the file, instead of expanding for minutes.
TEST(SpecInput, AliasesThatExpandPastTheBoundAreRefused) {
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    const std::vector<std::string> refs(9, absl::StrCat("*a", i - 1));
    absl::StrAppend(&text, "a", i, ": &a", i, " [", absl::StrJoin(refs, ", "), "]\n");
  }
  absl::StrAppend(&text, "steps: 3\n");
  auto s = ParseSpecText("laughs.yaml", text);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::string(s.status().message()).starts_with("laughs.yaml: the YAML spec expands to more than 100000 "
                                                            "values or 64 levels"))
      << s.status();
  // An alias used as YAML means it (a value repeated) still works.
  auto ok = ParseSpecText("job.yaml", "steps: &n 3\nlog_every: *n\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->log_every(), 3);
}

TEST(SpecInput, DashReadsTheStream) {
  std::istringstream in("steps: 3\n");
  auto s = ReadSpec("-", in);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->steps(), 3);
  std::istringstream none;
  EXPECT_FALSE(ReadSpec("/nonexistent/job.json", none).ok());
}


// Spec files as editors on Windows save them: CRLF line ends and a UTF-8 byte-order mark, in JSON and
// YAML, named by their extension or read from stdin (detected from the text): the same spec as the
// plain file. (A JSON file with a mark was refused as "Expected a value"; from stdin it was read as
// YAML.)
TEST(SpecInput, CrlfAndAByteOrderMarkReadAsThePlainFile) {
  const std::string good_json = "{\"model\": {\"preset\": \"tiny\"},\n \"steps\": 7,\n \"batch_size\": 3}\n";
  const std::string good_yaml = "model:\n  preset: tiny\nsteps: 7\nbatch_size: 3\n";
  auto crlf = [](std::string s) {
    std::string out;
    for (char c : s) out += c == '\n' ? std::string("\r\n") : std::string(1, c);
    return out;
  };
  const std::string bom = "\xEF\xBB\xBF";
  for (const auto& [name, plain] : {std::pair{std::string("job.json"), good_json}, {"job.yaml", good_yaml},
                                    {"stdin", good_json}, {"stdin", good_yaml}}) {
    auto want = ParseSpecText(name, plain);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(want->steps(), 7);
    ASSERT_EQ(want->batch_size(), 3);
    for (const std::string& odd : {crlf(plain), bom + plain, bom + crlf(plain)}) {
      SCOPED_TRACE(name + ": " + odd);
      auto got = ParseSpecText(name, odd);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->SerializeAsString(), want->SerializeAsString());
    }
  }
  // A file of only a mark is as empty as an empty one.
  auto empty = ParseSpecText("job.json", bom + "\r\n");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("the spec is empty"), std::string::npos) << empty.status();
}

}  // namespace
}  // namespace ftd::client
