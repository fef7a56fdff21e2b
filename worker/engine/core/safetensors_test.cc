// The safetensors reader and writer: round trip, corrupt files refused naming the tensor, sharded
// indexes; the parallel writer's bytes equal a sequential write's, and it stops on abort and on errors.
#include "worker/engine/core/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "worker/engine/core/fs_util.h"
#include "worker/engine/test_tmpdir.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const fs::path dir = TempDir();
  std::mt19937 rng(std::random_device{}());
  std::vector<float> a(3 * 5);
  for (auto& v : a) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint16_t> b = {1, 2, 3, 65535};
  ASSERT_TRUE(WriteSafetensors((dir / "x.safetensors").string(),
                               {{"a.weight", DType::kF32, {3, 5}, a.data()}, {"b", DType::kBF16, {4}, b.data()}},
                               {{"format", "pt"}})
                  .ok());
  auto f = SafetensorsFile::Open((dir / "x.safetensors").string());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorInfo* ta = (*f)->Find("a.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(std::memcmp((*f)->data(*ta), a.data(), a.size() * 4), 0);
  const TensorInfo* tb = (*f)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp((*f)->data(*tb), b.data(), 8), 0);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
}

std::string Header(const std::string& json) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + json;
}

absl::Status OpenBytes(const fs::path& p, const std::string& bytes) {
  { std::ofstream(p, std::ios::binary) << bytes; }
  return SafetensorsFile::Open(p.string()).status();
}

TEST(Safetensors, RejectsCorruptFilesNamingTheTensor) {
  const fs::path dir = TempDir();
  const fs::path p = dir / "bad.safetensors";
  std::string data(16, 'x');
  // Truncated: the tensor's data runs past the end of the file.
  auto s = OpenBytes(p, Header(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}})") + data);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("\"w\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
  // Shape and offsets disagree.
  s = OpenBytes(p, Header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})") + data);
  EXPECT_NE(s.message().find("\"w\""), absl::string_view::npos) << s;
  // Unknown dtype.
  s = OpenBytes(p, Header(R"({"emb":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})") + data);
  EXPECT_NE(s.message().find("\"emb\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("F7"), absl::string_view::npos) << s;
  // Overlapping tensors.
  s = OpenBytes(p, Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") + data);
  EXPECT_NE(s.message().find("overlaps"), absl::string_view::npos) << s;
  // Header length beyond the file, and a file shorter than the length field.
  s = OpenBytes(p, Header(R"({"a":1})").substr(0, 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  s = OpenBytes(p, "abc");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  // Not JSON.
  s = OpenBytes(p, Header("{nope") + data);
  EXPECT_NE(s.message().find("JSON"), absl::string_view::npos) << s;
}

TEST(Safetensors, ShardedIndexIsFollowed) {
  const fs::path dir = TempDir();
  float x = 1.5f, y = -2.0f;
  ASSERT_TRUE(WriteSafetensors((dir / "s1.safetensors").string(), {{"x", DType::kF32, {1}, &x}}).ok());
  ASSERT_TRUE(WriteSafetensors((dir / "s2.safetensors").string(), {{"y", DType::kF32, {1}, &y}}).ok());
  ASSERT_TRUE(WriteFileSynced((dir / "model.safetensors.index.json").string(),
                              R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})")
                  .ok());
  auto set = SafetensorsSet::OpenDir(dir.string());
  ASSERT_TRUE(set.ok()) << set.status();
  auto fy = set->Find("y");
  ASSERT_TRUE(fy.ok());
  float got;
  std::memcpy(&got, fy->first->data(*fy->second), 4);
  EXPECT_EQ(got, y);
  auto missing = set->Find("z");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("\"z\""), absl::string_view::npos);
}

std::string FileBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Tensors of odd sizes (one empty), every other one without data (fetched a piece at a time).
struct OddTensors {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorToWrite> tensors;
  std::string data;  // the data buffer a sequential writer produces: every tensor's bytes in order
  OddTensors() {
    std::mt19937 rng(7);
    const int64_t sizes[] = {4097, 1, 0, 100003, 3, 65536, 12289};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      bytes.emplace_back(static_cast<size_t>(sizes[i]));
      for (auto& b : bytes.back()) b = static_cast<uint8_t>(rng());
      data.append(reinterpret_cast<const char*>(bytes.back().data()), bytes.back().size());
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      tensors.push_back({absl::StrCat("t", i), DType::kU8, {static_cast<int64_t>(bytes[i].size())},
                         i % 2 == 0 ? bytes[i].data() : nullptr});
    }
  }
  // A fetch that copies from `bytes` and checks it is asked for pieces in file order.
  PieceFetch Fetch(uint64_t piece, int* calls) {
    return [this, piece, calls, last = std::pair<size_t, uint64_t>{0, 0}](size_t i, uint64_t off, uint64_t n,
                                                                          void* staging) mutable -> absl::Status {
      EXPECT_TRUE(tensors[i].data == nullptr);
      EXPECT_LE(n, piece);
      EXPECT_LE(off + n, bytes[i].size());
      EXPECT_TRUE(std::make_pair(i, off) >= last) << i << " " << off;
      last = {i, off + n};
      std::memcpy(staging, bytes[i].data() + off, n);
      ++*calls;
      return absl::OkStatus();
    };
  }
};

TEST(Safetensors, ParallelPiecesGiveTheBytesOfASequentialWrite) {
  const fs::path dir = TempDir();
  OddTensors odd;
  int calls = 0;
  WriteOptions seq;  // one piece per tensor, one writer, one piece at a time
  seq.fetch = odd.Fetch(1u << 30, &calls);
  seq.piece_bytes = 1u << 30;
  seq.in_flight = 1;
  seq.writers = 1;
  ASSERT_TRUE(WriteSafetensors((dir / "seq.safetensors").string(), odd.tensors, {{"format", "pt"}}, seq).ok());
  const std::string want = FileBytes(dir / "seq.safetensors");
  ASSERT_GT(want.size(), odd.data.size());
  EXPECT_EQ(want.substr(want.size() - odd.data.size()), odd.data);
  const std::tuple<uint64_t, int, int> kCases[] = {{4096, 3, 4}, {1000, 8, 2}, {7, 2, 3}};  // piece, in flight, writers
  for (const auto& [piece, in_flight, writers] : kCases) {
    uint64_t reported = 0, total = 0;
    ProgressMeter meter([&](const Progress& p) { reported = p.done_bytes, total = p.total_bytes; },
                        ProgressPhase::kSaveCheckpoint, odd.data.size(), std::chrono::nanoseconds(0));
    WriteOptions par;
    par.progress = &meter;
    par.fetch = odd.Fetch(piece, &calls);
    par.piece_bytes = piece;
    par.in_flight = in_flight;
    par.writers = writers;
    const fs::path p = dir / ("par-" + std::to_string(piece) + ".safetensors");
    auto s = WriteSafetensors(p.string(), odd.tensors, {{"format", "pt"}}, par);
    ASSERT_TRUE(s.ok()) << s;
    const std::string got = FileBytes(p);
    EXPECT_EQ(got.size(), want.size()) << "pieces of " << piece;
    const auto diff = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
    EXPECT_TRUE(diff.first == got.end() && diff.second == want.end())
        << "pieces of " << piece << ": the bytes differ from offset " << (diff.first - got.begin());
    EXPECT_EQ(reported, odd.data.size()) << "progress counts every byte written";
    EXPECT_EQ(total, odd.data.size());
    auto f = SafetensorsFile::Open(p.string());
    ASSERT_TRUE(f.ok()) << f.status();
  }
}

TEST(Safetensors, ParallelWriteStopsAtAPieceOnAbortAndOnErrors) {
  const fs::path dir = TempDir();
  OddTensors odd;
  // Abort after the third fetched piece: no piece is fetched after it.
  int calls = 0;
  ProgressMeter meter({}, ProgressPhase::kSaveCheckpoint, odd.data.size());
  meter.SetAbort([&] { return calls >= 3; });
  WriteOptions opt;
  opt.progress = &meter;
  opt.fetch = odd.Fetch(512, &calls);
  opt.piece_bytes = 512;
  auto s = WriteSafetensors((dir / "a.safetensors").string(), odd.tensors, {}, opt);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(calls, 3);
  // A fetch that fails: its status, nothing fetched after it.
  calls = 0;
  opt.progress = nullptr;
  opt.fetch = [&](size_t, uint64_t, uint64_t, void*) {
    return ++calls == 5 ? absl::DataLossError("device gone") : absl::OkStatus();
  };
  s = WriteSafetensors((dir / "b.safetensors").string(), odd.tensors, {}, opt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(calls, 5);
  // A write that fails in a writer thread (the file may not grow past 16 KiB): the error, naming
  // the file, and the fetching stops soon after.
  calls = 0;
  opt.fetch = odd.Fetch(512, &calls);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 16 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  s = WriteSafetensors((dir / "c.safetensors").string(), odd.tensors, {}, opt);
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("c.safetensors"), absl::string_view::npos) << s;
  EXPECT_LT(calls, 100) << "fetching went on after the error";
}

}  // namespace
}  // namespace ftd::engine
