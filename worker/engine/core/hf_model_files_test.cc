// The files that make a checkpoint a complete HF model directory: the base's config fields kept,
// generation_config.json copied or derived, the tokenizer files copied (with a chat template where a
// chat fine-tune's tokenizer had none), and unreadable inputs named. tests/python/test_model_dir.py
// checks the result with transformers.
#include "worker/engine/core/hf_model_files.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "worker/engine/test_tmpdir.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string Read(const fs::path& p) {
  std::stringstream ss;
  ss << std::ifstream(p).rdbuf();
  return ss.str();
}

// A LLaMA-3-like tokenizer: BOS, end of text, end of turn (its EOS); no <|eom_id|>.
void WriteTokenizer(const fs::path& dir) {
  Write(dir / "tokenizer.json", R"({"added_tokens": [{"id": 90, "content": "<|begin_of_text|>"},
                                                     {"id": 91, "content": "<|end_of_text|>"},
                                                     {"id": 99, "content": "<|eot_id|>"}],
                                    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}})");
  Write(dir / "tokenizer_config.json",
        R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "model_max_length": 128})");
}

spec::LlamaConfig Tiny() { return *spec::PresetLlamaConfig("tiny"); }

TEST(HfModelFiles, KeepsTheBasesConfigAndCopiesItsGenerationConfigAndTokenizer) {
  const fs::path d = TempDir();
  json base = json::parse(Tiny().ToJson());
  base["bos_token_id"] = 0;
  base["eos_token_id"] = 4;
  base["custom_field"] = {{"kept", true}};
  Write(d / "config.json", base.dump());
  Write(d / "generation_config.json", R"({"eos_token_id": [4, 7], "temperature": 0.6})");
  WriteTokenizer(d);
  Write(d / "special_tokens_map.json", R"({"bos_token": "<|begin_of_text|>"})");
  auto f = HfModelFiles::Read({(d / "config.json").string(), "spec.model.config_path", d.string(),
                               "spec.model.weights_path", ""});
  ASSERT_TRUE(f.ok()) << f.status();
  const json out = json::parse(f->ConfigJson(Tiny(), "bfloat16"));
  for (const auto& [key, value] : base.items()) {
    if (key != "torch_dtype" && key != "dtype") {
      EXPECT_EQ(out[key], value) << key;
    }
  }
  EXPECT_EQ(out["dtype"], "bfloat16");
  EXPECT_EQ(f->generation_config(), Read(d / "generation_config.json"));  // as it was
  EXPECT_EQ(f->names(), (std::vector<std::string>{"config.json", "generation_config.json", "tokenizer.json",
                                                  "tokenizer_config.json", "special_tokens_map.json"}));
  const fs::path ck = d / "ck";
  fs::create_directory(ck);
  ASSERT_TRUE(f->Write(ck.string(), Tiny(), "float32").ok());
  for (const auto& name : f->names()) EXPECT_TRUE(fs::is_regular_file(ck / name)) << name;
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_EQ(Read(ck / name), Read(d / name)) << name;
  }
  EXPECT_EQ(json::parse(Read(ck / "config.json"))["custom_field"]["kept"], true);
}

TEST(HfModelFiles, DerivesTheGenerationConfigFromTheTokenizersEndOfTurnTokens) {
  const fs::path d = TempDir();
  json base = json::parse(Tiny().ToJson());
  base["eos_token_id"] = 91;
  Write(d / "config.json", base.dump());
  WriteTokenizer(d);
  auto f = HfModelFiles::Read({d.string(), "spec.model.weights_path", d.string(), "spec.model.weights_path", ""});
  ASSERT_TRUE(f.ok()) << f.status();
  const json g = json::parse(f->generation_config());
  EXPECT_EQ(g["bos_token_id"], 90);                   // the tokenizer's, the config having none
  EXPECT_EQ(g["eos_token_id"], json::array({91, 99}));  // the config's, then the tokenizer's end of turn
  const json c = json::parse(f->ConfigJson(Tiny(), "float32"));
  EXPECT_EQ(c["bos_token_id"], 90);
  EXPECT_EQ(c["eos_token_id"], 91);  // the base's own is kept
}

TEST(HfModelFiles, APresetGetsItsIdsFromTheTokenizerAndNothingWithoutOne) {
  const fs::path d = TempDir();
  WriteTokenizer(d);
  auto f = HfModelFiles::Read({"", "", d.string(), "spec.data.tokenizer_path", ""});
  ASSERT_TRUE(f.ok()) << f.status();
  const json c = json::parse(f->ConfigJson(Tiny(), "float32"));
  EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["bos_token_id"], 90);
  EXPECT_EQ(c["eos_token_id"], 99);
  EXPECT_EQ(json::parse(f->generation_config())["eos_token_id"], json::array({99, 91}));
  auto none = HfModelFiles::Read({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->names(), std::vector<std::string>{"config.json"});
  EXPECT_EQ(json::parse(none->ConfigJson(Tiny(), "float32")), json::parse([] {
              auto c = Tiny();
              c.torch_dtype = "float32";
              return c.ToJson();
            }()));
}

TEST(HfModelFiles, AChatFineTuneGetsTheTemplateOnlyWhereTheTokenizerHasNone) {
  const fs::path d = TempDir();
  WriteTokenizer(d);
  auto f = HfModelFiles::Read({"", "", d.string(), "spec.data.tokenizer_path", "TEMPLATE"});
  ASSERT_TRUE(f.ok()) << f.status();
  const fs::path out = d / "out";
  fs::create_directory(out);
  ASSERT_TRUE(f->Write(out.string(), Tiny(), "float32").ok());
  json cfg = json::parse(Read(out / "tokenizer_config.json"));
  EXPECT_EQ(cfg["chat_template"], "TEMPLATE");
  EXPECT_EQ(cfg["model_max_length"], 128);  // the rest kept
  Write(d / "chat_template.jinja", "THEIRS");  // a template of its own, in transformers' newer file
  f = HfModelFiles::Read({"", "", d.string(), "spec.data.tokenizer_path", "TEMPLATE"});
  ASSERT_TRUE(f->Write(out.string(), Tiny(), "float32").ok());
  EXPECT_FALSE(json::parse(Read(out / "tokenizer_config.json")).contains("chat_template"));
  EXPECT_EQ(Read(out / "chat_template.jinja"), "THEIRS");
}

TEST(HfModelFiles, UnreadableOrMalformedInputsAreNamed) {
  const fs::path d = TempDir();
  Write(d / "config.json", Tiny().ToJson());
  Write(d / "generation_config.json", "{not json");
  auto f = HfModelFiles::Read({d.string(), "spec.model.weights_path", "", "", ""});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("spec.model.weights_path: " + (d / "generation_config.json").string() +
                                      " is not a JSON object"),
            std::string::npos)
      << f.status();
  fs::remove(d / "generation_config.json");
  fs::create_directory(d / "tok");
  fs::create_directory(d / "tok" / "tokenizer.json");  // not a file
  f = HfModelFiles::Read({d.string(), "spec.model.weights_path", (d / "tok").string(), "spec.data.tokenizer_path", ""});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("spec.data.tokenizer_path"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status();
}

}  // namespace
}  // namespace ftd::engine
