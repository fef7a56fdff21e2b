// How ftd-worker takes the signals that stop a run, and what it says when it exits without
// having reported one.
//
// SIGTERM and SIGINT (stop after a checkpoint) and SIGUSR1 (stop without one) are blocked in every
// thread and taken by one thread of their own (sigwait), which sets the flags the training loop
// polls and logs the signal on stderr. A signal therefore never interrupts LibTorch, CUDA, NVML or
// a write to stdout, whichever thread those libraries run on, and a library that installs its own
// handler later cannot take it. Start it before anything starts a thread (CUDA, gRPC, NVML).
//
// ExitWatch: an atexit hook that, when exit() runs before the program marked its result reported,
// writes the stage the program was in and the caller's backtrace to stderr, so that an exit from
// inside a library names itself.
#pragma once

#include <atomic>

namespace ftd::worker {

// Blocks the stop signals in the calling thread (threads started later inherit the mask) and starts
// the thread that waits for them. stop and skip_checkpoint must outlive the process.
void StartStopSignalThread(std::atomic<bool>* stop, std::atomic<bool>* skip_checkpoint);

// The stage reported by the exit hook; a string literal.
void SetStage(const char* stage);
// Registers the exit hook; call once, early in main.
void InstallExitWatch();
// The program reached its own exit path: the exit hook stays quiet from here on.
void MarkResultReported();

}  // namespace ftd::worker
