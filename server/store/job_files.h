// A job's files in the daemon's data directory (<data-dir>/jobs/<id>/: worker.log, trace.json,
// checkpoints/step-N/) and the operations on them that deleting, pruning, retention and resuming
// need. No gRPC, no store.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ftd/v1/job_spec.pb.h"
#include "ftd/v1/worker.pb.h"
#include "util/dir_tree.h"

namespace ftd::server {

// The bytes of the regular files under `path` (0 when it does not exist).
int64_t TreeBytes(const std::string& path);

// Removes `path` and everything under it, never following a link beneath it (util/dir_tree.h);
// returns the bytes freed.
using ::ftd::util::RemoveTree;

// The directory `rel` ("jobs/j-000001/checkpoints") beneath the directory `base`: `base` is opened
// as given (the admin's path), each component of `rel` beneath the one before it with O_NOFOLLOW, so
// a symbolic link anywhere below `base` (a job's directory may belong to its worker's user, who
// could swap one in) fails the open, ELOOP or ENOTDIR, and is never followed. An empty `rel` opens
// `base`. A close-on-exec descriptor, or -1 with errno set.
int OpenDirBeneath(const std::string& base, const std::string& rel);

// The newest complete checkpoint in `dir` (or in `rel` beneath it, as OpenDirBeneath resolves it):
// the step-N directory with the highest N that has its MANIFEST.json (written last,
// docs/checkpoint-format.md), neither of them a link. Its path; nullopt when there is none.
std::optional<std::string> NewestCheckpoint(const std::string& dir, const std::string& rel = "");

// Copies the tree `from` to `to` (which must not exist) with hard links where the filesystem allows
// and byte copies where it does not (another filesystem). Each source is opened with O_NOFOLLOW
// beneath its directory's descriptor; symbolic links (and fifos, sockets, devices) are skipped, so
// nothing outside `from` is linked or copied.
absl::Status LinkOrCopyTree(const std::string& from, const std::string& to);
// The same from `rel` beneath `base`, resolved as OpenDirBeneath does.
absl::Status LinkOrCopyTree(const std::string& base, const std::string& rel, const std::string& to);

// Gives `dir` and everything under it to uid:gid, never following a symbolic link (the tree may
// belong to that user already, who could have planted links in it): each directory is opened with
// O_NOFOLLOW beneath its parent's descriptor, each link changed itself (AT_SYMLINK_NOFOLLOW).
absl::Status ChownTree(const std::string& dir, uid_t uid, gid_t gid);

// Removes partial checkpoints (step-N.tmp directories) in `dir`, left by a writer that died; the
// caller makes sure no writer runs there. Returns the bytes freed. With `rel`, the directory is `rel`
// beneath `dir`, resolved as OpenDirBeneath does: nothing is removed through a link.
int64_t RemovePartialCheckpoints(const std::string& dir, const std::string& rel = "");

// One line of a job's log for a step report: "[ftd] step 10/100 loss 2.3456 lr 1e-04 1234 tok/s", with
// "eval_loss 2.5" after the loss on the steps where the held-out loss was measured.
std::string StepLine(const ftd::v1::StepReport& step);
// What a job's log and events say once a checkpoint write has a predicted end: "writing the
// checkpoint after step 4: 12.0 of 48.0 GiB, about 25s left".
std::string CheckpointWriteNote(const ftd::v1::PhaseProgress& p);

}  // namespace ftd::server
