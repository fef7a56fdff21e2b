#include "client/output.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace ftd::client {
namespace {

using nlohmann::ordered_json;

TEST(Output, YamlReadsBackAsTheSameData) {
  const ordered_json v = {{"id", "j-000001"},       {"step", 12},      {"loss", 0.25},      {"ok", true},
                          {"none", nullptr},        {"numeric", "123"}, {"word", "yes"},     {"empty", ""},
                          {"colon", "a: b"},        {"list", {1, "x"}}, {"nested", {{"k", "v"}}},
                          {"big", 18446744073709551615ull}};
  const std::string yaml = Emit(v, OutputFormat::kYaml);
  const YAML::Node back = YAML::Load(yaml);
  EXPECT_EQ(back["id"].as<std::string>(), "j-000001");
  EXPECT_EQ(back["step"].as<int>(), 12);
  EXPECT_EQ(back["loss"].as<double>(), 0.25);
  EXPECT_TRUE(back["ok"].as<bool>());
  EXPECT_TRUE(back["none"].IsNull());
  EXPECT_EQ(back["numeric"].Tag(), "!") << yaml;  // quoted: a string, not the number 123
  EXPECT_EQ(back["word"].Tag(), "!") << yaml;
  EXPECT_EQ(back["empty"].as<std::string>(), "");
  EXPECT_EQ(back["colon"].as<std::string>(), "a: b");
  EXPECT_EQ(back["list"][1].as<std::string>(), "x");
  EXPECT_EQ(back["nested"]["k"].as<std::string>(), "v");
  EXPECT_EQ(back["big"].as<uint64_t>(), 18446744073709551615ull);
}

TEST(Output, JsonIsIndentedAndKeepsOrder) {
  const ordered_json v = {{"z", 1}, {"a", 2}};
  EXPECT_EQ(Emit(v, OutputFormat::kJson), "{\n  \"z\": 1,\n  \"a\": 2\n}\n");
}

TEST(Output, TheFlagTakesTheThreeFormats) {
  for (const auto& [arg, want] : std::vector<std::pair<std::string, OutputFormat>>{
           {"table", OutputFormat::kTable}, {"json", OutputFormat::kJson}, {"YAML", OutputFormat::kYaml}}) {
    CLI::App app;
    OutputFormat f = OutputFormat::kTable;
    AddOutputFlag(&app, &f);
    app.parse(std::vector<std::string>{arg, "-o"});  // CLI11 takes the arguments in reverse
    EXPECT_EQ(f, want) << arg;
  }
  CLI::App app;
  OutputFormat f = OutputFormat::kTable;
  AddOutputFlag(&app, &f);
  EXPECT_THROW(app.parse(std::vector<std::string>{"text", "-o"}), CLI::ValidationError);
}

}  // namespace
}  // namespace ftd::client
