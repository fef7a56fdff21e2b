// The job-file operations (deleting, resuming, retention's leftovers) and the log reader, on real
// files in a temporary directory.
#include "server/store/job_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "server/jobs/job_log.h"

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

class JobFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-job-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(JobFilesTest, TheNewestCheckpointIsTheHighestStepWithAManifest) {
  const fs::path ck = dir_ / "checkpoints";
  EXPECT_FALSE(NewestCheckpoint(ck.string()).has_value());  // no directory at all
  Write(ck / "step-00000002" / "MANIFEST.json", "{}");
  Write(ck / "step-00000010" / "MANIFEST.json", "{}");
  Write(ck / "step-00000012" / "model.safetensors", "partial");  // no manifest: incomplete
  Write(ck / "step-00000020.tmp" / "MANIFEST.json", "{}");        // a partial write
  Write(ck / "notes" / "MANIFEST.json", "{}");
  EXPECT_EQ(NewestCheckpoint(ck.string()), (ck / "step-00000010").string());
}

TEST_F(JobFilesTest, PartialCheckpointsAreRemovedAndCompleteOnesKept) {
  const fs::path ck = dir_ / "checkpoints";
  Write(ck / "step-00000010" / "MANIFEST.json", "{}");
  Write(ck / "step-00000020.tmp" / "model.safetensors", std::string(1000, 'x'));
  Write(ck / "step-00000030.tmp" / "optimizer.safetensors", std::string(24, 'y'));
  EXPECT_EQ(RemovePartialCheckpoints(ck.string()), 1024);
  EXPECT_TRUE(fs::exists(ck / "step-00000010" / "MANIFEST.json"));
  EXPECT_FALSE(fs::exists(ck / "step-00000020.tmp"));
  EXPECT_FALSE(fs::exists(ck / "step-00000030.tmp"));
}

TEST_F(JobFilesTest, RemoveTreeCountsTheBytesItFreed) {
  Write(dir_ / "j" / "worker.log", std::string(100, 'l'));
  Write(dir_ / "j" / "checkpoints" / "step-1" / "model.safetensors", std::string(4096, 'm'));
  EXPECT_EQ(TreeBytes((dir_ / "j").string()), 4196);
  EXPECT_EQ(RemoveTree((dir_ / "j").string()).value(), 4196);
  EXPECT_FALSE(fs::exists(dir_ / "j"));
  EXPECT_EQ(RemoveTree((dir_ / "j").string()).value(), 0);
}

TEST_F(JobFilesTest, ACheckpointIsCopiedWithHardLinks) {
  Write(dir_ / "a" / "step-5" / "MANIFEST.json", "{\"step\": 5}");
  Write(dir_ / "a" / "step-5" / "sub" / "x.bin", "xyz");
  ASSERT_TRUE(LinkOrCopyTree((dir_ / "a" / "step-5").string(), (dir_ / "b" / "step-5").string()).ok());
  std::ifstream in(dir_ / "b" / "step-5" / "sub" / "x.bin");
  std::string got;
  in >> got;
  EXPECT_EQ(got, "xyz");
  EXPECT_EQ(fs::hard_link_count(dir_ / "b" / "step-5" / "MANIFEST.json"), 2u);
}

// A job directory belongs to the worker's user, who may plant links in it: deleting it removes the
// links and never what they point at, and copying it (here across filesystems, so byte copies, not
// hard links) never copies an outside file's bytes.
TEST_F(JobFilesTest, LinksInATreeAreNeitherFollowedWhenRemovingNorCopied) {
  Write(dir_ / "outside" / "secret", "outside bytes");
  Write(dir_ / "outside" / "d" / "kept", "kept");
  Write(dir_ / "j" / "step-1" / "MANIFEST.json", "{}");
  fs::create_symlink(dir_ / "outside" / "secret", dir_ / "j" / "step-1" / "file-link");
  fs::create_directory_symlink(dir_ / "outside" / "d", dir_ / "j" / "step-1" / "dir-link");

  char tmpl[] = "/dev/shm/ftd-job-files-test-XXXXXX";  // tmpfs: another filesystem than /tmp
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path other = tmpl;
  const auto copied = LinkOrCopyTree((dir_ / "j" / "step-1").string(), (other / "step-1").string());
  EXPECT_TRUE(copied.ok()) << copied;
  EXPECT_TRUE(fs::is_regular_file(other / "step-1" / "MANIFEST.json"));
  EXPECT_FALSE(fs::is_regular_file(fs::symlink_status(other / "step-1" / "file-link")));
  EXPECT_FALSE(fs::exists(other / "step-1" / "dir-link" / "kept"));
  std::error_code ec;
  fs::remove_all(other, ec);

  const auto freed = RemoveTree((dir_ / "j").string());
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 2) << "the MANIFEST.json's bytes; links free none";
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "j")));
  std::string secret;
  std::getline(std::ifstream(dir_ / "outside" / "secret"), secret);
  EXPECT_EQ(secret, "outside bytes");
  EXPECT_TRUE(fs::is_regular_file(dir_ / "outside" / "d" / "kept"));

  fs::create_directory_symlink(dir_ / "outside" / "d", dir_ / "j2");  // the tree itself a link
  EXPECT_EQ(RemoveTree((dir_ / "j2").string()).value(), 0);
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "j2")));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "outside" / "d" / "kept"));
}

TEST_F(JobFilesTest, TheLogReaderFollowsAGrowingFileAndTailsFromAWholeLine) {
  const fs::path log = dir_ / "worker.log";
  LogReader early(log.string(), 0);
  EXPECT_EQ(early.Read(1 << 20), "");  // not there yet
  Write(log, "one\ntwo\nthree\n");
  EXPECT_EQ(early.Read(1 << 20), "one\ntwo\nthree\n");
  EXPECT_EQ(early.Read(1 << 20), "");
  std::ofstream(log, std::ios::app) << "four\n";
  EXPECT_EQ(early.Read(1 << 20), "four\n");

  LogReader tail(log.string(), 8);  // the last 8 bytes are "e\nfour\n" and part of "three"
  EXPECT_EQ(tail.Read(1 << 20), "four\n");
  LogReader exact(log.string(), 11);  // "three\nfour\n": the window starts at a line
  EXPECT_EQ(exact.Read(1 << 20), "three\nfour\n");
}

TEST_F(JobFilesTest, TheLogReaderTailsWholeLinesCountedFromTheEnd) {
  const fs::path log = dir_ / "worker.log";
  Write(log, "one\ntwo\nthree\nfour\n");
  EXPECT_EQ(LogReader(log.string(), 0, 0, 2).Read(1 << 20), "three\nfour\n");
  EXPECT_EQ(LogReader(log.string(), 0, 0, 1).Read(1 << 20), "four\n");
  EXPECT_EQ(LogReader(log.string(), 0, 0, 4).Read(1 << 20), "one\ntwo\nthree\nfour\n");
  EXPECT_EQ(LogReader(log.string(), 0, 0, 100).Read(1 << 20), "one\ntwo\nthree\nfour\n");
  EXPECT_EQ(LogReader(log.string(), 8, 0, 3).Read(1 << 20), "four\n") << "both: the later start";
  EXPECT_EQ(LogReader(log.string(), 0, 8, 1).Read(1 << 20), "three\nfour\n") << "an offset wins";
  std::ofstream(log, std::ios::app) << "half";  // a last line still being written counts as one
  EXPECT_EQ(LogReader(log.string(), 0, 0, 2).Read(1 << 20), "four\nhalf");
  // Lines across the reader's 64 KiB blocks.
  std::string big;
  for (int i = 0; i < 20000; ++i) big += "line " + std::to_string(i) + "\n";
  Write(log, big);
  EXPECT_EQ(LogReader(log.string(), 0, 0, 3).Read(1 << 20), "line 19997\nline 19998\nline 19999\n");
  const std::string last15000 = LogReader(log.string(), 0, 0, 15000).Read(1 << 20);
  EXPECT_EQ(last15000.substr(0, 10), "line 5000\n");
  EXPECT_TRUE(big.size() > last15000.size() && big.substr(big.size() - last15000.size()) == last15000);
}

TEST_F(JobFilesTest, TheLogReaderResumesAtAnOffsetAndSaysWhereItIs) {
  const fs::path log = dir_ / "worker.log";
  LogReader later(log.string(), 0, 8);  // a follow resumed at byte 8, before the file exists
  EXPECT_EQ(later.Read(1 << 20), "");
  Write(log, "one\ntwo\nthree\n");
  EXPECT_EQ(later.position(), 8);
  EXPECT_EQ(later.Read(1 << 20), "three\n");
  EXPECT_EQ(later.position(), 14);
  LogReader tail(log.string(), 8);
  EXPECT_EQ(tail.position(), 8) << "the tail's first whole line";
  LogReader both(log.string(), 100, 4);  // an offset wins over tail_bytes
  EXPECT_EQ(both.Read(3), "two");
  EXPECT_EQ(both.position(), 7);
  LogReader past(log.string(), 0, 20);  // beyond the end: nothing until the file grows there
  EXPECT_EQ(past.Read(1 << 20), "");
  std::ofstream(log, std::ios::app) << "four\nfive\n";
  EXPECT_EQ(past.Read(1 << 20), "ive\n");  // "four\n" ends at byte 19
}

TEST(CheckpointWriteNote, SaysTheBytesAndThePredictedTimeLeft) {
  ftd::v1::PhaseProgress p;
  p.set_phase("save_checkpoint");
  p.set_step(120);
  p.set_done_bytes(int64_t{3} << 29);
  p.set_total_bytes(int64_t{48} << 30);
  p.set_eta_s(41.2);
  EXPECT_EQ(CheckpointWriteNote(p), "writing the checkpoint after step 120: 1.5 GiB of 48.0 GiB, about 42s left");
  // A small model's checkpoint is not "0.0 of 0.0 GiB".
  p.set_done_bytes(300 << 10);
  p.set_total_bytes(int64_t{5} << 20);
  p.set_eta_s(1);
  EXPECT_EQ(CheckpointWriteNote(p), "writing the checkpoint after step 120: 300 KiB of 5.0 MiB, about 1s left");
}

TEST(StepLine, SaysTheStepAndItsNumbers) {
  ftd::v1::StepReport s;
  s.set_step(10);
  s.set_total_steps(100);
  s.set_loss(2.34567);
  s.set_lr(1e-4);
  s.set_grad_norm(0.5);
  s.set_tokens_per_s(1234.4);
  s.set_step_time_s(0.25);
  EXPECT_EQ(StepLine(s), "[ftd] step 10/100 loss 2.3457 lr 0.0001 grad_norm 0.5 1234 tok/s 0.250s/step");
  s.set_eval_loss(2.71828);  // a step where the held-out loss was measured
  EXPECT_EQ(StepLine(s), "[ftd] step 10/100 loss 2.3457 eval_loss 2.7183 lr 0.0001 grad_norm 0.5 1234 tok/s 0.250s/step");
}

}  // namespace

// A job's checkpoints/ (or a step in it) swapped for a link out by the worker's user: below the data
// directory nothing is resolved through it. The newest checkpoint is not found there, nothing is
// copied from it, and partial checkpoints behind it are not removed.
TEST_F(JobFilesTest, AJobsCheckpointsSwappedForALinkAreNotFollowedBeneathTheDataDirectory) {
  const fs::path outside = dir_ / "outside";
  Write(outside / "step-00000099" / "MANIFEST.json", "{}");
  Write(outside / "step-00000098.tmp" / "model.safetensors", "other user's partial write");
  fs::create_directories(dir_ / "data" / "jobs" / "j-000001");
  fs::create_directory_symlink(outside, dir_ / "data" / "jobs" / "j-000001" / "checkpoints");
  const std::string data = (dir_ / "data").string(), rel = "jobs/j-000001/checkpoints";
  EXPECT_TRUE(NewestCheckpoint((dir_ / "data" / rel).string()).has_value());  // a path alone follows it
  EXPECT_EQ(OpenDirBeneath(data, rel), -1);
  EXPECT_TRUE(errno == ELOOP || errno == ENOTDIR) << errno;  // O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR
  EXPECT_FALSE(NewestCheckpoint(data, rel).has_value());
  EXPECT_FALSE(LinkOrCopyTree(data, rel + "/step-00000099", (dir_ / "copy").string()).ok());
  EXPECT_FALSE(fs::exists(dir_ / "copy" / "MANIFEST.json"));
  EXPECT_EQ(RemovePartialCheckpoints(data, rel), 0);
  EXPECT_TRUE(fs::exists(outside / "step-00000098.tmp" / "model.safetensors"));
  // A step directory that is a link is passed over too; the real ones beneath are used.
  fs::remove(dir_ / "data" / "jobs" / "j-000001" / "checkpoints");
  Write(dir_ / "data" / rel / "step-00000002" / "MANIFEST.json", "{}");
  fs::create_directory_symlink(outside / "step-00000099", dir_ / "data" / rel / "step-00000050");
  EXPECT_EQ(NewestCheckpoint(data, rel), (dir_ / "data" / rel / "step-00000002").string());
  Write(dir_ / "data" / rel / "step-00000003.tmp" / "x", "1234");
  EXPECT_EQ(RemovePartialCheckpoints(data, rel), 4);
}

}  // namespace ftd::server
