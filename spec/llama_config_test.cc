// HF config.json parsing (both RoPE styles), validation, and the presets.
#include "spec/llama_config.h"

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace ftd::spec {
namespace {

TEST(LlamaConfig, ParsesHfConfigsBothRopeStyles) {
  auto a = ParseLlamaConfig(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":12,
    "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"rope_theta":500000.0,
    "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192}})");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->head_dim, 4);
  EXPECT_EQ(a->rope_scaling.type, "llama3");
  EXPECT_EQ(a->rope_theta, 500000.0);
  auto b = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":2,"rope_parameters":{"rope_type":"default","rope_theta":1234.0}})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rope_theta, 1234.0);
  EXPECT_TRUE(b->rope_scaling.type.empty());
  EXPECT_EQ(b->num_key_value_heads, 2);
  // Round trip through our own writer.
  auto c = ParseLlamaConfig(a->ToJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->NumParameters(), a->NumParameters());
}

TEST(LlamaConfig, RejectsBadConfigsNamingTheField) {
  auto gqa = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":12,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":3,"num_key_value_heads":2})");
  EXPECT_NE(gqa.status().message().find("num_key_value_heads"), absl::string_view::npos) << gqa.status();
  auto missing = ParseLlamaConfig(R"({"hidden_size":12})");
  EXPECT_NE(missing.status().message().find("vocab_size"), absl::string_view::npos) << missing.status();
  auto rope = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":2,"rope_scaling":{"rope_type":"yarn","factor":2.0}})");
  EXPECT_NE(rope.status().message().find("yarn"), absl::string_view::npos) << rope.status();
}

TEST(LlamaConfig, EightBPresetHasEightBillionParameters) {
  auto c = PresetLlamaConfig("llama-3.1-8b");
  ASSERT_TRUE(c.ok());
  // Meta-Llama-3.1-8B: 8,030,261,248 parameters.
  EXPECT_EQ(c->NumParameters(), 8030261248);
}

TEST(LlamaConfig, RowsLongerThanTheModelsPositionsAreRefused) {
  auto c = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":2,"max_position_embeddings":256})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(CheckSequenceLength(*c, 256, "its config.json").ok());
  const auto st = CheckSequenceLength(*c, 2048, "its config.json");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("spec.seq_len 2048 is above the model's max_position_embeddings 256 (its config.json)"),
            absl::string_view::npos)
      << st;
  EXPECT_NE(st.message().find("at most 256"), absl::string_view::npos) << st;
}

// An HF config.json as Windows tools save it (CRLF line ends, a UTF-8 byte-order mark) reads as the
// plain file.
TEST(LlamaConfig, CrlfAndAByteOrderMarkReadAsThePlainFile) {
  const std::string plain = PresetLlamaConfig("tiny")->ToJson();
  ASSERT_FALSE(plain.empty());
  auto want = ParseLlamaConfig(plain);
  ASSERT_TRUE(want.ok()) << want.status();
  std::string crlf;
  for (char c : nlohmann::json::parse(plain).dump(2)) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string& odd : {crlf, "\xEF\xBB\xBF" + plain, "\xEF\xBB\xBF" + crlf}) {
    auto got = ParseLlamaConfig(odd);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->ToJson(), want->ToJson());
  }
}

}  // namespace
}  // namespace ftd::spec
