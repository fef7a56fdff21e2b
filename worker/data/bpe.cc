#include "worker/data/bpe.h"

#include <array>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/data/utf8.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;

struct ByteLevelTables {
  std::array<char32_t, 256> to_char{};
  ByteLevelTables() {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68 bytes,
    // in increasing order, for U+0100, U+0101, ...
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables t;
  return t;
}

// The raw bytes of a ByteLevel-alphabet spelling; false when it has a character outside the alphabet.
bool TextToBytes(std::string_view text, std::string* bytes) {
  bytes->clear();
  if (!IsValidUtf8(text)) return false;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const int b = ByteLevelByte(DecodeUtf8At(text, i, &len));
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

absl::Status Field(std::string_view name, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("model.", Av(name), ": ", Av(problem)));
}

}  // namespace

char32_t ByteLevelChar(uint8_t byte) { return Tables().to_char[byte]; }

int ByteLevelByte(char32_t c) {
  if (c < 0x100) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    return printable ? static_cast<int>(c) : -1;
  }
  if (c >= 0x100 && c < 0x100 + 68) {
    static const std::array<int16_t, 68> from = [] {
      std::array<int16_t, 68> f{};
      for (int b = 0; b < 256; ++b) {
        const char32_t ch = Tables().to_char[b];
        if (ch >= 0x100) f[ch - 0x100] = static_cast<int16_t>(b);
      }
      return f;
    }();
    return from[c - 0x100];
  }
  return -1;
}

absl::Status BpeModel::Load(const json& model) {
  if (!model.is_object()) return absl::InvalidArgumentError("model: expected an object");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    return Field("type", absl::StrCat("\"", type, "\" is not supported; ftd reads byte-level BPE models (\"BPE\")"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return Field("dropout", "BPE dropout samples merges at random; set it to null for deterministic encoding");
  }
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(name) && !model[name].is_null() && !(model[name].is_string() && model[name] == "")) {
      return Field(name, "is not supported (byte-level BPE does not use it); set it to null");
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) return Field("vocab", "missing or not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) return Field("merges", "missing or not an array");

  const json& vocab = model["vocab"];
  text_to_id_.reserve(vocab.size());
  bytes_to_id_.reserve(vocab.size());
  uint32_t limit = 0;
  for (const auto& [text, v] : vocab.items()) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() >= std::numeric_limits<uint32_t>::max()) {
      return Field("vocab", absl::StrCat("the id of \"", text, "\" is not a non-negative 32-bit integer"));
    }
    const auto id = v.get<uint32_t>();
    text_to_id_[text] = id;
    limit = std::max(limit, id + 1);
  }
  id_to_text_.assign(limit, std::string());
  has_id_.assign(limit, false);
  std::string bytes;
  for (const auto& [text, id] : text_to_id_) {
    if (has_id_[id]) {
      return Field("vocab", absl::StrFormat("\"%s\" and \"%s\" share the id %d", id_to_text_[id], text, id));
    }
    id_to_text_[id] = text;
    has_id_[id] = true;
    if (TextToBytes(text, &bytes)) bytes_to_id_[bytes] = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteLevelChar(static_cast<uint8_t>(b)), &ch);
    auto it = text_to_id_.find(ch);
    byte_id_[b] = it == text_to_id_.end() ? -1 : int64_t{it->second};
  }
  const bool all_bytes = std::all_of(std::begin(byte_id_), std::end(byte_id_), [](int64_t id) { return id >= 0; });
  if (!all_bytes) {
    // HF drops a byte without a token when there is no unk_token (this does too); with one, it
    // would emit unk, or byte-fallback tokens, which this implementation does not do.
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      return Field("unk_token", "is set and some bytes have no token in the vocabulary; ftd does not emit unknown tokens");
    }
    if (model.value("byte_fallback", false)) {
      return Field("byte_fallback", "is true and some bytes have no token in the vocabulary; ftd does not emit byte-fallback tokens");
    }
  }

  const json& merges = model["merges"];
  merges_.reserve(merges.size());
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {  // "a b", the older form
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) {
        return Field("merges", absl::StrFormat("entry %d (\"%s\") is not two tokens separated by one space", i, line));
      }
      a = std::move(parts[0]);
      b = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return Field("merges", absl::StrFormat("entry %d is neither \"a b\" nor [\"a\", \"b\"]", i));
    }
    const auto ia = text_to_id_.find(a), ib = text_to_id_.find(b), iab = text_to_id_.find(a + b);
    for (const auto& [it, name] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{iab, a + b}}) {
      if (it == text_to_id_.end()) {
        return Field("merges", absl::StrFormat("entry %d (%s %s): \"%s\" is not in the vocabulary", i, a, b, name));
      }
    }
    merges_.insert_or_assign(Key(ia->second, ib->second), Merge{rank, iab->second});  // a later duplicate wins, as in HF
    ++rank;
  }
  return absl::OkStatus();
}

const uint32_t* BpeModel::FindText(std::string_view token) const {
  auto it = text_to_id_.find(token);
  return it == text_to_id_.end() ? nullptr : &it->second;
}

namespace {
constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
}

size_t BpeModel::ScanMerge(uint32_t* s, uint32_t* rank, uint32_t* merged, size_t n) const {
  auto look = [&](size_t i) {
    const Merge* m = FindMerge(s[i], s[i + 1]);
    rank[i] = m ? m->rank : kNoMerge;
    merged[i] = m ? m->id : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;  // the lowest rank, the leftmost among equals
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNoMerge) break;
    s[best] = merged[best];
    // Symbol best+1 goes; the pairs after it move down one place.
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) look(best);
    if (best > 0) look(best - 1);
  }
  return n;
}

void BpeModel::MergeByScan(std::vector<uint32_t>* symbols) const {
  std::vector<uint32_t>& s = *symbols;
  if (s.size() < 2) return;
  std::vector<uint32_t> rank(s.size()), merged(s.size());
  s.resize(ScanMerge(s.data(), rank.data(), merged.data(), s.size()));
}

void BpeModel::MergeByHeap(std::vector<uint32_t>* symbols) const {
  std::vector<uint32_t>& s = *symbols;
  const size_t n = s.size();
  if (n < 2) return;
  struct Entry {
    uint32_t rank;
    uint32_t pos;
    uint32_t id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
    if (i + 1 < n) {
      if (const Merge* m = FindMerge(s[i], s[i + 1])) queue.push({m->rank, static_cast<uint32_t>(i), m->id});
    }
  }
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const auto right = static_cast<size_t>(next[top.pos]);
    const Merge* m = FindMerge(s[top.pos], s[right]);
    if (m == nullptr || m->id != top.id) continue;  // an entry for a pair that has since changed
    s[top.pos] = m->id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      const auto p = static_cast<size_t>(prev[top.pos]);
      if (const Merge* pm = FindMerge(s[p], s[top.pos])) queue.push({pm->rank, static_cast<uint32_t>(p), pm->id});
    }
    if (next[top.pos] >= 0) {
      if (const Merge* nm = FindMerge(s[top.pos], s[next[top.pos]])) queue.push({nm->rank, top.pos, nm->id});
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) s[k++] = s[i];
  }
  s.resize(k);
}

void BpeModel::EncodePiece(std::string_view piece, std::vector<uint32_t>* out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = bytes_to_id_.find(piece); it != bytes_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const int64_t id = byte_id_[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out->push_back(static_cast<uint32_t>(id));
    return;
  }
  // Short pieces: the scan over a stack array (no allocation).
  if (piece.size() <= kScanLimit) {
    uint32_t s[kScanLimit], rank[kScanLimit], merged[kScanLimit];
    size_t n = 0;
    for (char c : piece) {
      const int64_t id = byte_id_[static_cast<uint8_t>(c)];
      if (id >= 0) s[n++] = static_cast<uint32_t>(id);
    }
    n = ScanMerge(s, rank, merged, n);
    out->insert(out->end(), s, s + n);
    return;
  }
  std::vector<uint32_t> s;
  s.reserve(piece.size());
  for (char c : piece) {
    const int64_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id >= 0) s.push_back(static_cast<uint32_t>(id));
  }
  MergeByHeap(&s);
  out->insert(out->end(), s.begin(), s.end());
}

}  // namespace ftd::data
