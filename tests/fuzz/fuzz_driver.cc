// A mutation driver for a libFuzzer target (LLVMFuzzerTestOneInput), for builds without libFuzzer:
// runs every file of the seed corpus, then --runs inputs, each a corpus entry (or an earlier
// input) changed by one to four random mutations: bit flips, bytes set to edge values (0x00, 0x7f,
// 0x80, 0xff), insertions, deletions, repeats, splices of two entries, and, in text, numbers swapped
// for edge values (0, -1, 1e308, 1e400, 2^63, NaN) and strings for long or invalid UTF-8 ones. The
// random stream is seeded (--seed), so a run is repeatable.
//
// A crash (the target aborts on an UNKNOWN or INTERNAL answer) or an input running past
// --timeout-s prints the input in hex and fails. `fuzz_driver FILE...` replays inputs.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

const std::string* g_current = nullptr;  // the input being run, for the crash and hang reports

void Report(int sig) {
  const char* what = sig == SIGALRM ? "fuzz: an input ran past the time limit (a hang)\n" : "fuzz: an input crashed\n";
  (void)!::write(2, what, std::strlen(what));
  if (g_current != nullptr) {
    static const char kHex[] = "0123456789abcdef";
    (void)!::write(2, "input (hex): ", 13);
    for (unsigned char c : *g_current) {
      const char pair[2] = {kHex[c >> 4], kHex[c & 15]};
      (void)!::write(2, pair, 2);
    }
    (void)!::write(2, "\n", 1);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string Mutate(const std::vector<std::string>& pool) {
    std::string s = Pick(pool);
    const int n = Below(2) == 0 ? 1 : 1 + static_cast<int>(Below(4));  // mostly one: inputs stay near-valid
    for (int i = 0; i < n; ++i) MutateOnce(&s, pool);
    if (s.size() > kMaxSize) s.resize(kMaxSize);
    return s;
  }

 private:
  static constexpr size_t kMaxSize = 1 << 16;

  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  const std::string& Pick(const std::vector<std::string>& pool) { return pool[Below(pool.size())]; }

  void MutateOnce(std::string* s, const std::vector<std::string>& pool) {
    static const unsigned char kEdges[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0xc0, '"', '{', '}', '\\', '.'};
    static const char* kNumbers[] = {"0", "-1", "1e308", "1e400", "-1e400", "9223372036854775808", "NaN",
                                     "\"Infinity\"", "4294967296", "2147483648", "0.5", "1e-400", "-0"};
    // The text-aware changes (5, 6) are drawn more often: they keep JSON parseable, so inputs reach
    // the spec's validation rather than stopping at the parser.
    static const int kOps[] = {0, 1, 2, 3, 4, 5, 5, 5, 5, 6, 6, 6, 7, 8};
    const size_t pos = Below(s->size() + 1);
    switch (kOps[Below(std::size(kOps))]) {
      case 0:  // flip a bit
        if (!s->empty()) (*s)[pos % s->size()] ^= static_cast<char>(1 << Below(8));
        break;
      case 1:  // an edge byte, set or inserted
        if (!s->empty() && Below(2) == 0) {
          (*s)[pos % s->size()] = static_cast<char>(kEdges[Below(sizeof kEdges)]);
        } else {
          s->insert(pos, 1, static_cast<char>(kEdges[Below(sizeof kEdges)]));
        }
        break;
      case 2:  // delete a range
        if (!s->empty()) s->erase(pos % s->size(), 1 + Below(16));
        break;
      case 3: {  // repeat a range
        if (s->empty()) break;
        const size_t from = pos % s->size(), len = std::min<size_t>(1 + Below(64), s->size() - from);
        const std::string piece = s->substr(from, len);
        for (uint64_t k = 1 + Below(Below(2) == 0 ? 4 : 200); k > 0; --k) s->insert(from, piece);
        break;
      }
      case 4: {  // splice: a prefix of this, a suffix of another
        const std::string& other = Pick(pool);
        *s = s->substr(0, pos) + other.substr(Below(other.size() + 1));
        break;
      }
      case 5: {  // a number in text swapped for an edge value
        const size_t at = s->find_first_of("0123456789", pos);
        if (at == std::string::npos) break;
        const size_t end = s->find_first_not_of("0123456789.eE+-", at);
        s->replace(at, (end == std::string::npos ? s->size() : end) - at, kNumbers[Below(std::size(kNumbers))]);
        break;
      }
      case 6: {  // a string's contents swapped for a long or non-UTF-8 one
        const size_t open = s->find('"', pos);
        if (open == std::string::npos) break;
        const size_t close = s->find('"', open + 1);
        if (close == std::string::npos) break;
        const uint64_t kind = Below(4);
        const std::string v = kind == 0   ? std::string(1 + Below(8192), 'x')
                              : kind == 1 ? std::string("\xff\xfe\xc3")
                              : kind == 2 ? std::string("../../../etc/passwd")
                                          : std::string();
        s->replace(open + 1, close - open - 1, v);
        break;
      }
      case 7:  // the other mode (wire bytes <-> JSON), by the first byte
        if (!s->empty()) (*s)[0] ^= 1;
        break;
      default:  // truncate
        s->resize(pos);
        break;
    }
  }

  std::mt19937_64 rng_;
};

int Run(const std::string& input) {
  g_current = &input;
  ::alarm(static_cast<unsigned>(std::getenv("FTD_FUZZ_TIMEOUT_S") ? std::atoi(std::getenv("FTD_FUZZ_TIMEOUT_S")) : 10));
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  ::alarm(0);
  g_current = nullptr;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 100000;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atol(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      paths.emplace_back(a);
    }
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGALRM}) ::signal(sig, Report);
  std::vector<std::string> corpus;
  for (const auto& p : paths) {
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p)) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // a repeatable order
      for (const auto& f : files) corpus.push_back(ReadFile(f));
    } else {
      corpus.push_back(ReadFile(p));
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "usage: %s [--runs N] [--seed S] CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  for (const auto& c : corpus) Run(c);
  Mutator m(seed);
  std::vector<std::string> pool = corpus;  // grows with some of the inputs run: mutations of mutations
  for (long i = 0; i < runs; ++i) {
    std::string input = m.Mutate(pool);
    Run(input);
    if (i % 1024 == 0 && pool.size() < 256) pool.push_back(std::move(input));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz: %zu corpus inputs and %ld mutated inputs (seed %llu) in %.1f s: no crash, no hang, no UNKNOWN or "
              "INTERNAL answer\n",
              corpus.size(), runs, static_cast<unsigned long long>(seed), s);
  return 0;
}
