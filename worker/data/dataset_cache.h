// Tokenize once: a JSONL dataset's Corpus kept on disk, keyed by the SHA-256 of the dataset's
// bytes, the tokenizer's files and the format options, so every job on the same data reuses it
// (`ftd-worker prepare` fills it ahead of time). Torch-free and protobuf-free.
//
// CACHE_DIR/KEY/ holds ids.u32 (little-endian uint32), loss.u8 (one byte per id), docs.u64
// (little-endian uint64 document offsets, first 0, last the number of ids) and meta.json (counts
// and the skipped lines). A directory is written as KEY.tmp-PID, synced, and renamed into place,
// so a reader sees a whole entry or none. Every step works beneath the cache directory's opened
// descriptor and never follows a link (util/dir_tree.h). A cache directory writable by every user is
// not used, nor a default one that belongs to another uid: its entries could be anyone's.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/parallel_encode.h"

namespace ftd::data {

struct PrepareRequest {
  std::string path;            // the JSONL file
  std::string tokenizer_dir;   // holds tokenizer.json (and tokenizer_config.json)
  JsonlFormat format;
  std::string cache_dir;       // empty: DefaultCacheDir()
  ParallelOptions parallel;
};

struct Prepared {
  Corpus corpus;
  std::string dir;          // the cache entry; empty when it could not be written
  bool reused = false;      // found in the cache rather than tokenized now
  std::string cache_error;  // why the entry could not be written (the corpus is still returned)
};

// $FTD_DATA_CACHE, else $HOME/.cache/ftd/data where HOME is a directory, else
// /tmp/ftd-data-cache-UID (used only while it belongs to this uid).
std::string DefaultCacheDir();

// The cache key of a request (hex SHA-256); reads the files it names.
absl::StatusOr<std::string> CacheKey(const PrepareRequest& request);

// The request's Corpus from the cache, or tokenized and stored there.
absl::StatusOr<Prepared> PrepareJsonl(const PrepareRequest& request);

absl::Status WriteCorpus(const std::string& dir, const Corpus& corpus);
absl::StatusOr<Corpus> ReadCorpus(const std::string& dir);

}  // namespace ftd::data
