// Unit tests of the tokenizer module: UTF-8 repair, the pattern translation, BPE merging, added
// tokens, refusals, decoding and the parallel file encoding. Parity with HF `tokenizers` on
// trained tokenizers is in tests/python/test_tokenizer.py.
#include "worker/data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/data/parallel_encode.h"
#include "worker/data/progress.h"
#include "worker/data/regex.h"
#include "worker/data/utf8.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

std::string Hex(std::string_view s) {
  std::string out;
  for (unsigned char c : s) absl::StrAppend(&out, absl::Hex(c, absl::kZeroPad2), " ");
  return out;
}

// --- UTF-8 -------------------------------------------------------------------------------------

std::string Repaired(std::string_view s) {
  std::string out;
  AppendRepairedUtf8(s, &out);
  return out;
}

TEST(Utf8, ReplacesMaximalSubpartsAsTheUnicodeStandardShows) {
  // The Unicode Standard 15.0, section 3.9, Table 3-8: U+FFFD for maximal subparts.
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_EQ(Repaired(in), "a\uFFFD\uFFFD\uFFFD" "b\uFFFD" "c\uFFFD\uFFFD" "d");
}

TEST(Utf8, IllFormedSequences) {
  const std::string r = "\uFFFD";
  EXPECT_EQ(Repaired("\xED\xA0\x80"), r + r + r);  // a surrogate: ED takes only 80..9F
  EXPECT_EQ(Repaired("\xC0\xAF"), r + r);          // overlong '/'
  EXPECT_EQ(Repaired("\xE0\x80\xAF"), r + r + r);  // overlong
  EXPECT_EQ(Repaired("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(Repaired("\xF5\x80"), r + r);
  EXPECT_EQ(Repaired("x\xE2\x82"), "x" + r);        // truncated at the end: one subpart
  EXPECT_EQ(Repaired("\xE2\x82x"), r + "x");
  EXPECT_EQ(Repaired("\xF0\x9F\x98"), r);
  EXPECT_EQ(Repaired("\xFF\xFE"), r + r);
  const std::string valid("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x00z", 13);
  EXPECT_EQ(Repaired(std::string(valid.data(), 13)), std::string(valid.data(), 13));
}

TEST(Utf8, RepairAlwaysGivesValidTextAndKeepsValidText) {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string out = Repaired(s);
    ASSERT_TRUE(IsValidUtf8(out)) << Hex(s);
    if (IsValidUtf8(s)) {
      ASSERT_EQ(out, s);
    } else {
      ASSERT_NE(out.find("\uFFFD"), std::string::npos) << Hex(s);
    }
  }
}

TEST(Utf8, EncodesAndDecodesEveryScalarValue) {
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    std::string s;
    AppendUtf8(c, &s);
    size_t len;
    ASSERT_TRUE(IsValidUtf8(s));
    ASSERT_EQ(DecodeUtf8At(s, 0, &len), c);
    ASSERT_EQ(len, s.size());
  }
}

// --- Pattern translation -------------------------------------------------------------------------

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> Matches(const SplitRegex& re, std::string_view s) {
  MatchScratch scratch;
  std::vector<std::string> out;
  size_t pos = 0, b, e;
  while (pos < s.size()) {
    auto found = re.Find(s, pos, &scratch, &b, &e);
    EXPECT_TRUE(found.ok());
    if (!found.ok() || !*found) break;
    out.emplace_back(s.substr(b, e - b));
    pos = e > b ? e : e + 1;
  }
  return out;
}

TEST(Pattern, WhiteSpaceIsUnicodeWhiteSpace) {
  auto re = SplitRegex::FromOniguruma(R"(\s+)");
  ASSERT_TRUE(re.ok()) << re.status();
  // U+180E (Mongolian vowel separator) is not White_Space since Unicode 6.3; U+0085 and U+3000 are.
  EXPECT_EQ(Matches(**re, "a\u180Eb"), std::vector<std::string>{});
  EXPECT_EQ(Matches(**re, "a\u0085\u3000b"), std::vector<std::string>{"\u0085\u3000"});
  MatchScratch scratch;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    std::string s;
    AppendUtf8(c, &s);
    auto m = (*re)->MatchesAt(s, 0, &scratch);
    ASSERT_TRUE(m.ok());
    ASSERT_EQ(*m, IsUnicodeWhiteSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
}

TEST(Pattern, OnigurumaMeaningsAreKept) {
  auto hex = SplitRegex::FromOniguruma(R"(\h+)");  // Oniguruma: hex digits
  ASSERT_TRUE(hex.ok());
  EXPECT_EQ(Matches(**hex, "zz09afAFg"), std::vector<std::string>{"09afAF"});
  auto vt = SplitRegex::FromOniguruma(R"(\v)");  // the vertical tab only
  ASSERT_TRUE(vt.ok());
  EXPECT_EQ(Matches(**vt, "a\x0B" "b\nc"), std::vector<std::string>{"\x0B"});
  auto dot = SplitRegex::FromOniguruma(R"(a.b)");  // `.` takes a newline
  ASSERT_TRUE(dot.ok());
  EXPECT_EQ(Matches(**dot, "a\nb"), std::vector<std::string>{"a\nb"});
  auto caret = SplitRegex::FromOniguruma(R"(^a)");  // ^ at every line start
  ASSERT_TRUE(caret.ok());
  EXPECT_EQ(Matches(**caret, "ab\nab"), (std::vector<std::string>{"a", "a"}));
  auto u = SplitRegex::FromOniguruma(R"(\u00e9+)");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(Matches(**u, "x\u00e9\u00e9y"), std::vector<std::string>{"\u00e9\u00e9"});
}

TEST(Pattern, Llama3PatternSplitsAsDocumented) {
  auto re = SplitRegex::FromOniguruma(kLlama3Pattern);
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(**re, "I'LL pay 1234567 dollars!!\n\n  ok"),
            (std::vector<std::string>{"I", "'LL", " pay", " ", "123", "456", "7", " dollars", "!!\n\n", " ", " ok"}));
}

TEST(Pattern, RefusesConstructsWithoutAnExactTranslation) {
  for (const char* p : {R"(\w+)", R"(\bx)", R"([a[b]])", R"([a&&b])", R"((?m)a)", R"(a{,3})", R"([\S])", R"(\xff)",
                        R"(\1)", R"([]a])", R"((?x)a)"}) {
    auto t = TranslateOnigPattern(p);
    EXPECT_FALSE(t.ok()) << p;
    if (!t.ok()) {
      EXPECT_THAT(std::string(t.status().message()), HasSubstr("not supported")) << p;
    }
  }
  EXPECT_TRUE(TranslateOnigPattern(R"((?i:x)(?-i)(?=a)(?!b)(?<=c)(?<!d)(?>e)[\p{L}\-\]]\p{^N}\x{41}\t)").ok());
  auto bad = SplitRegex::FromOniguruma(R"(\p{NoSuchProperty})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("PCRE2 cannot compile"));
}

// --- A small tokenizer.json, built here ----------------------------------------------------------

std::string Text(std::string_view bytes) {  // raw bytes -> ByteLevel spelling
  std::string out;
  for (char c : bytes) AppendUtf8(ByteLevelChar(static_cast<uint8_t>(c)), &out);
  return out;
}

// Vocabulary: the 256 bytes (id = byte value), then one id per merge result in order.
json MakeTokenizer(const std::vector<std::pair<std::string, std::string>>& merges, json pre_tokenizer,
                   json added = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Text(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(Text(a + b))) vocab[Text(a + b)] = vocab.size();
    m.push_back(json::array({Text(a), Text(b)}));
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", m}}}};
}

json ByteLevelPre(bool use_regex = true) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json Llama3Pre() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", kLlama3Pattern}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        ByteLevelPre(false)})}};
}

std::shared_ptr<const Tokenizer> Load(const json& j, std::string config = "") {
  auto t = Tokenizer::FromJson(j.dump(), config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

std::vector<uint32_t> Ids(const Tokenizer& t, std::string_view text, bool special = true) {
  auto ids = t.Encode(text, {.add_special_tokens = special});
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<uint32_t>{};
}

std::vector<uint32_t> Bytes(std::string_view s) {
  std::vector<uint32_t> out;
  for (char c : s) out.push_back(static_cast<uint8_t>(c));
  return out;
}

TEST(Bpe, MergesLowestRankFirstLeftmostAmongEquals) {
  // ranks: (b,c)=0 (a,b)=1 (a,bc)=2 (x,x)=3
  auto t = Load(MakeTokenizer({{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"x", "x"}}, ByteLevelPre(false)));
  ASSERT_TRUE(t);
  const uint32_t bc = 256, ab = 257, abc = 258, xx = 259;
  EXPECT_EQ(Ids(*t, "abc"), std::vector<uint32_t>{abc});  // b+c first, then a+bc; never a+b
  EXPECT_EQ(Ids(*t, "ab"), std::vector<uint32_t>{ab});
  EXPECT_EQ(Ids(*t, "abab"), (std::vector<uint32_t>{ab, ab}));
  // "xxx": the leftmost pair merges first.
  EXPECT_EQ(Ids(*t, "xxx"), (std::vector<uint32_t>{xx, 'x'}));
  EXPECT_EQ(Ids(*t, "xxxxx"), (std::vector<uint32_t>{xx, xx, 'x'}));
  EXPECT_EQ(Ids(*t, "zbcz"), (std::vector<uint32_t>{'z', bc, 'z'}));
}

TEST(Bpe, ScanAndHeapAgreeOnRandomMerges) {
  // A random merge table over a 4-letter alphabet, then random words through both algorithms.
  std::mt19937 rng(11);
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::vector<std::pair<std::string, std::string>> merges;
  std::set<std::string> seen(tokens.begin(), tokens.end());
  while (merges.size() < 60) {
    const std::string& x = tokens[rng() % tokens.size()];
    const std::string& y = tokens[rng() % tokens.size()];
    if (x.size() + y.size() > 8 || seen.contains(x + y)) continue;
    merges.emplace_back(x, y);
    seen.insert(x + y);
    tokens.push_back(x + y);
  }
  auto t = Load(MakeTokenizer(merges, ByteLevelPre(false)));
  ASSERT_TRUE(t);
  for (int i = 0; i < 3000; ++i) {
    std::string w(1 + rng() % 300, 'a');
    for (char& c : w) c = static_cast<char>('a' + rng() % 4);
    std::vector<uint32_t> scan = Bytes(w), heap = Bytes(w);
    t->model().MergeByScan(&scan);
    t->model().MergeByHeap(&heap);
    ASSERT_EQ(scan, heap) << w;
    std::vector<uint32_t> encoded;
    t->model().EncodePiece(w, &encoded);
    ASSERT_EQ(encoded, scan) << w;
    auto back = t->Decode(encoded);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, w);
  }
}

TEST(Bpe, IgnoreMergesTakesAWholeVocabularyEntry) {
  json j = MakeTokenizer({{"a", "b"}}, ByteLevelPre(false));
  j["model"]["vocab"][Text("abc")] = 300;  // no merge reaches it
  auto plain = Load(j);
  j["model"]["ignore_merges"] = true;
  auto ignoring = Load(j);
  ASSERT_TRUE(plain && ignoring);
  EXPECT_EQ(Ids(*plain, "abc"), (std::vector<uint32_t>{256, 'c'}));
  EXPECT_EQ(Ids(*ignoring, "abc"), std::vector<uint32_t>{300});
  EXPECT_EQ(Ids(*ignoring, "abcabc"), (std::vector<uint32_t>{256, 'c', 256, 'c'}));
}

TEST(Bpe, BothMergeSpellingsLoadAlike) {
  json pairs = MakeTokenizer({{"a", "b"}, {"ab", "c"}, {" ", "ab"}}, ByteLevelPre());
  json strings = pairs;
  json legacy = json::array({"#version: 0.2"});
  for (const auto& m : pairs["model"]["merges"]) legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  strings["model"]["merges"] = legacy;
  auto a = Load(pairs), b = Load(strings);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->model().num_merges(), 3u);
  EXPECT_EQ(b->model().num_merges(), 3u);
  EXPECT_EQ(Ids(*a, "abc ab xab"), Ids(*b, "abc ab xab"));
}

// A merges list may name a pair twice (tokenizer.json files edited by hand or merged from two
// sources do): the later entry wins, with its later rank, as HF's BPE builds its merge map
// (tokenizers 0.23.3: [a b, b c, a b] encodes "abc" as a + bc, and [b c, a b, b c] as ab + c;
// tests/python/test_tokenizer.py compares a whole file with duplicates against it).
TEST(Bpe, ALaterDuplicateMergeWinsWithItsRank) {
  {
    auto t = Load(MakeTokenizer({{"a", "b"}, {"b", "c"}, {"a", "b"}}, ByteLevelPre(false)));
    ASSERT_TRUE(t);
    const uint32_t ab = 256, bc = 257;
    EXPECT_EQ(t->model().num_merges(), 2u);
    EXPECT_EQ(Ids(*t, "abc"), (std::vector<uint32_t>{'a', bc}));  // b+c (rank 1) before a+b (rank 2)
    EXPECT_EQ(Ids(*t, "ab"), std::vector<uint32_t>{ab});          // still a merge
    std::vector<uint32_t> scan = Bytes("abcab"), heap = Bytes("abcab");
    t->model().MergeByScan(&scan);
    t->model().MergeByHeap(&heap);
    EXPECT_EQ(scan, (std::vector<uint32_t>{'a', bc, ab}));
    EXPECT_EQ(heap, scan);
  }
  {
    auto t = Load(MakeTokenizer({{"b", "c"}, {"a", "b"}, {"b", "c"}}, ByteLevelPre(false)));
    ASSERT_TRUE(t);
    const uint32_t bc = 256, ab = 257;
    EXPECT_EQ(Ids(*t, "abc"), (std::vector<uint32_t>{ab, 'c'}));
    EXPECT_EQ(Ids(*t, "bc"), std::vector<uint32_t>{bc});
  }
}

TEST(Bpe, LongPiecesTakeTheHeapAndRoundTrip) {
  auto t = Load(MakeTokenizer({{" ", " "}, {"  ", "  "}, {"a", "a"}}, Llama3Pre()));
  ASSERT_TRUE(t);
  for (size_t n : {BpeModel::kScanLimit - 1, BpeModel::kScanLimit, BpeModel::kScanLimit + 1, size_t{100000}}) {
    for (char c : {' ', 'a'}) {
      const std::string s(n, c);
      const auto ids = Ids(*t, s);
      auto back = t->Decode(ids);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, s);
      if (c == 'a') {
        EXPECT_EQ(ids.size(), (n + 1) / 2);  // pairs of a, one left over when odd
      }
    }
  }
}

// --- Added tokens ---------------------------------------------------------------------------------

json Added(uint32_t id, std::string content, bool special = true, json extra = json::object()) {
  json t = {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
            {"rstrip", false},   {"normalized", !special}, {"special", special}};
  for (auto& [k, v] : extra.items()) t[k] = v;
  return t;
}

TEST(AddedTokens, CutOutLeftmostLongestBeforePreTokenizing) {
  auto t = Load(MakeTokenizer({}, Llama3Pre(),
                              json::array({Added(256, "<|a|>"), Added(257, "<|a|>x"), Added(258, "<|b|>")})));
  ASSERT_TRUE(t);
  EXPECT_EQ(Ids(*t, "q<|a|>xy<|b|><|a|>"),
            (std::vector<uint32_t>{'q', 257, 'y', 258, 256}));
  EXPECT_EQ(Ids(*t, "<|a|<|b|>"), (std::vector<uint32_t>{'<', '|', 'a', '|', 258}));
  EXPECT_EQ(*t->TokenToId("<|b|>"), 258u);
  auto d = t->Decode(std::vector<uint32_t>{'q', 257, 258});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "q<|a|>x<|b|>");
  auto skipped = t->Decode(std::vector<uint32_t>{'q', 257, 258}, /*skip_special_tokens=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "q");
}

TEST(AddedTokens, StripAndSingleWord) {
  auto t = Load(MakeTokenizer({}, ByteLevelPre(false),
                              json::array({Added(256, "<L>", false, {{"lstrip", true}}),
                                           Added(257, "<R>", false, {{"rstrip", true}}),
                                           Added(258, "wx", false, {{"single_word", true}})})));
  ASSERT_TRUE(t);
  // lstrip takes the white space before (U+3000 too), rstrip after.
  EXPECT_EQ(Ids(*t, "a \u3000<L>b"), (std::vector<uint32_t>{'a', 256, 'b'}));
  EXPECT_EQ(Ids(*t, "a<R> \t b"), (std::vector<uint32_t>{'a', 257, 'b'}));  // single_word: only between non-word characters (é is a letter, so "éwx" has no word "wx").
  EXPECT_EQ(Ids(*t, "wx wx,"), (std::vector<uint32_t>{258, ' ', 258, ','}));
  EXPECT_EQ(Ids(*t, "\u00e9wx"), Bytes("\u00e9wx"));
  EXPECT_EQ(Ids(*t, "wx_"), Bytes("wx_"));
  EXPECT_EQ(Ids(*t, "-wx-"), (std::vector<uint32_t>{'-', 258, '-'}));
}


TEST(AddedTokens, IdsFollowHfsRule) {
  // Not in the model vocabulary: consecutive ids from the vocabulary size (256 here).
  json j = MakeTokenizer({}, ByteLevelPre(), json::array({Added(256, "<s>"), Added(258, "</s>")}));
  auto t = Tokenizer::FromJson(j.dump(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("\"</s>\" has id 258, but HF tokenizers gives it id 257"));
  // An added token spelled like a vocabulary entry takes that entry's id.
  json k = MakeTokenizer({}, ByteLevelPre(), json::array({Added('a', "a")}));
  auto u = Load(k);
  ASSERT_TRUE(u);
  EXPECT_EQ(Ids(*u, "bab"), (std::vector<uint32_t>{'b', 'a', 'b'}));
}

// --- Templates, config, decoding ------------------------------------------------------------------

json Template(const std::string& bos, uint32_t id) {
  json special = {{"id", bos}, {"ids", json::array({id})}, {"tokens", json::array({bos})}};
  json single = json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", json::array()},
          {"special_tokens", {{bos, special}}}};
}

TEST(Tokenizer, TemplateAddsBosAndConfigNamesBosEos) {
  json j = MakeTokenizer({}, Llama3Pre(), json::array({Added(256, "<|begin_of_text|>"), Added(257, "<|end|>")}));
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors", json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true},
                                                      {"trim_offsets", false}, {"use_regex", true}},
                                                     Template("<|begin_of_text|>", 256)})}};
  const std::string config = R"({"bos_token": "<|begin_of_text|>",
      "eos_token": {"__type": "AddedToken", "content": "<|end|>", "lstrip": false}})";
  auto t = Load(j, config);
  ASSERT_TRUE(t);
  EXPECT_EQ(Ids(*t, "hi"), (std::vector<uint32_t>{256, 'h', 'i'}));
  EXPECT_EQ(Ids(*t, "hi", false), (std::vector<uint32_t>{'h', 'i'}));
  EXPECT_EQ(Ids(*t, ""), std::vector<uint32_t>{256});
  EXPECT_EQ(t->bos_id(), 256u);
  EXPECT_EQ(t->eos_id(), 257u);
  auto bad = Tokenizer::FromJson(j.dump(), R"({"eos_token": "<|nope|>"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("eos_token \"<|nope|>\" is not a token"));
}

TEST(Tokenizer, DecodeRefusesUnknownIdsAndRepairsBytes) {
  auto t = Load(MakeTokenizer({}, ByteLevelPre()));
  ASSERT_TRUE(t);
  auto bad = t->Decode(std::vector<uint32_t>{'a', 9999});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("id 9999 at position 1"));
  auto half = t->Decode(std::vector<uint32_t>{'a', 0xE2, 0x82});  // half of a UTF-8 sequence
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(*half, "a\uFFFD");
  // Invalid input encodes as its repaired text does.
  EXPECT_EQ(Ids(*t, "a\xFF" "b"), Ids(*t, "a\uFFFD" "b"));
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementNamingIt) {
  const json base = MakeTokenizer({}, ByteLevelPre());
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer NFC is not supported"},
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type: \"WordPiece\" is not supported"},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {[](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix"},
      {[](json& j) {
         j["model"]["vocab"].erase(Text("\x01"));
         j["model"]["byte_fallback"] = true;
       },
       "model.byte_fallback"},
      {[](json& j) {
         j["model"]["vocab"].erase(Text("\x01"));
         j["model"]["unk_token"] = "a";
       },
       "model.unk_token"},
      {[](json& j) { j["model"]["merges"] = json::array({"a q"}); }, "is not in the vocabulary"},
      {[](json& j) { j["model"]["merges"] = json::array({"a b c"}); }, "not two tokens"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre-tokenizer type \"Whitespace\""},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer: is null"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"},
                               {"invert", false}};
       },
       "has no ByteLevel step"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({ByteLevelPre(), {{"type", "Split"},
                                                                               {"pattern", {{"String", " "}}},
                                                                               {"behavior", "Isolated"},
                                                                               {"invert", false}}})}};
       },
       "after ByteLevel"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w"}}}, {"behavior", "Isolated"},
                               {"invert", false}};
       },
       "the escape \\w"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({{{"type", "Split"},
                                                               {"pattern", {{"String", " "}}},
                                                               {"behavior", "Dropped"},
                                                               {"invert", false}},
                                                              ByteLevelPre()})}};
       },
       "\"Dropped\" is not one of"},
      {[](json& j) { j["decoder"] = nullptr; }, "decoder null is not supported"},
      {[](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "is not supported"},
      {[](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, "\"BertProcessing\" is not supported"},
      {[](json& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation is set"},
      {[](json& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }, "padding is set"},
      {[](json& j) { j["version"] = "2.0"; }, "version \"2.0\""},
  };
  for (const Case& c : cases) {
    json j = base;
    c.edit(j);
    auto t = Tokenizer::FromJson(j.dump(), "");
    ASSERT_FALSE(t.ok()) << c.message;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.message));
  }
  auto missing = Tokenizer::LoadDir("/nonexistent-model-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent-model-dir/tokenizer.json"));
}

TEST(Tokenizer, SplitBehaviours) {
  // Split on "-" with each behaviour, then ByteLevel without its regex: pieces show the behaviour.
  auto pieces = [](const std::string& behavior, bool invert, std::string_view text) {
    json pre = {{"type", "Sequence"},
                {"pretokenizers", json::array({{{"type", "Split"},
                                                {"pattern", {{"String", "-"}}},
                                                {"behavior", behavior},
                                                {"invert", invert}},
                                               ByteLevelPre(false)})}};
    auto t = Load(MakeTokenizer({}, pre));
    std::vector<std::string> out;
    Encoder e(*t);
    EXPECT_TRUE(e.Pieces(text, &out).ok());
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Isolated", false, "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pieces("Removed", false, "a-b--c"), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces("MergedWithPrevious", false, "a-b--c"), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces("MergedWithNext", false, "a-b--c"), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces("Contiguous", false, "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(pieces("Removed", true, "a-b--c"), (V{"-", "-", "-"}));
}

// --- Parallel encoding --------------------------------------------------------------------------

TEST(Parallel, ThreadsAndChunksKeepRecordOrder) {
  auto t = Load(MakeTokenizer({{"a", "b"}, {"c", "d"}, {" ", "ab"}}, Llama3Pre()));
  ASSERT_TRUE(t);
  std::mt19937 rng(3);
  std::vector<std::string> texts(2000);
  for (auto& s : texts) {
    s.resize(rng() % 40);
    for (char& c : s) c = "abcd 1\n\xE2"[rng() % 8];
  }
  std::vector<std::string_view> records(texts.begin(), texts.end());
  Encoder enc(*t);
  std::vector<std::vector<uint32_t>> expect(records.size());
  for (size_t r = 0; r < records.size(); ++r) ASSERT_TRUE(enc.Encode(records[r], &expect[r]).ok());
  for (int threads : {1, 2, 5}) {
    ParallelOptions o;
    o.threads = threads;
    o.chunk_bytes = 100;  // many chunks
    auto got = EncodeRecords(*t, records, o);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), records.size());
    for (size_t r = 0; r < records.size(); ++r) {
      const auto ids = (*got)[r];
      ASSERT_EQ(std::vector<uint32_t>(ids.begin(), ids.end()), expect[r]) << "threads " << threads << " record " << r;
    }
  }
}

TEST(Parallel, JsonlReportsBadLinesByNumber) {
  auto t = Load(MakeTokenizer({}, ByteLevelPre()));
  ASSERT_TRUE(t);
  const std::string data =
      "{\"text\": \"ab\"}\n"
      "not json\n"
      "{\"other\": 1}\n"
      "\n"
      "{\"text\": 5}\n"
      "[1]\n"
      "{\"text\": \"c\\nd\"}\n";
  ParallelOptions o;
  o.threads = 2;
  o.chunk_bytes = 16;
  o.encode.add_special_tokens = false;
  auto r = EncodeJsonlField(*t, data, "text", o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lines, 7u);
  ASSERT_EQ(r->records.size(), 2u);
  EXPECT_EQ(r->line_of, (std::vector<uint64_t>{1, 7}));
  const auto second = r->records[1];
  EXPECT_EQ(std::vector<uint32_t>(second.begin(), second.end()), (std::vector<uint32_t>{'c', '\n', 'd'}));
  std::vector<uint64_t> bad;
  for (const auto& b : r->bad_lines) bad.push_back(b.line);
  EXPECT_EQ(bad, (std::vector<uint64_t>{2, 3, 4, 5, 6}));
  const std::string msg = DescribeBadLines(r->bad_lines, "data.jsonl");
  EXPECT_THAT(msg, HasSubstr("5 bad lines in data.jsonl: line 2: not valid JSON"));
  EXPECT_THAT(msg, HasSubstr("line 3: no field \"text\""));
  EXPECT_THAT(msg, HasSubstr("line 4: blank line"));
  EXPECT_THAT(msg, HasSubstr("line 5: field \"text\" is number, not a string"));
}

TEST(Parallel, SplitLines) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(SplitLines(""), V{});
  EXPECT_EQ(SplitLines("a\n"), V{"a"});
  EXPECT_EQ(SplitLines("a\n\nb"), (V{"a", "", "b"}));
  EXPECT_EQ(SplitLines("a\r\nb\n"), (V{"a\r", "b"}));
}

TEST(Progress, RendersAndStaysQuietWithoutATerminal) {
  EXPECT_EQ(Progress::Render("tok", 5'000'000, 10'000'000, 2.0, 10),
            "tok  50% [=====>    ] 5.0/10.0 MB  2.5 MB/s  ETA 2s");
  EXPECT_EQ(Progress::Render("tok", 10'000'000, 10'000'000, 4.0, 4), "tok 100% [====] 10.0/10.0 MB  2.5 MB/s");
  if (!Progress::StderrIsTerminal()) {
    Progress p("tok", 10, true);
    EXPECT_FALSE(p.active());
  }
}


// tokenizer.json and tokenizer_config.json pretty-printed with CRLF line ends, or saved with a UTF-8
// byte-order mark, load as the plain files (same ids, same BOS/EOS). (HF's own loader refuses the
// mark; accepting it costs nothing.)
TEST(Tokenizer, CrlfAndAByteOrderMarkLoadAsThePlainFiles) {
  const json j = MakeTokenizer({{"a", "b"}, {"b", "c"}, {"ab", "c"}}, ByteLevelPre(false),
                               json::array({Added(259, "<s>"), Added(260, "</s>")}));
  const std::string config = R"({"bos_token": "<s>", "eos_token": "</s>"})";
  auto crlf = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == '\n' ? std::string("\r\n") : std::string(1, c);
    return out;
  };
  const std::string bom = "\xEF\xBB\xBF";
  auto plain = Tokenizer::FromJson(j.dump(), config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const auto& [tj, tc] : {std::pair{crlf(j.dump(2)), crlf(config)}, {bom + j.dump(), bom + config},
                               {bom + crlf(j.dump(2)), bom + crlf(config)}}) {
    auto odd = Tokenizer::FromJson(tj, tc);
    ASSERT_TRUE(odd.ok()) << odd.status();
    EXPECT_EQ(Ids(**odd, "abc <s>abcabc</s>"), Ids(**plain, "abc <s>abcabc</s>"));
    EXPECT_EQ((*odd)->bos_id(), (*plain)->bos_id());
    EXPECT_EQ((*odd)->eos_id(), (*plain)->eos_id());
  }
}

}  // namespace
}  // namespace ftd::data
