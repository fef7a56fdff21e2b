// ProcessGroupNCCL, in a translation unit of its own: only builds whose LibTorch has it and whose
// NCCL headers were found compile this file (worker/CMakeLists.txt, FTD_HAVE_NCCL).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace ftd::engine {

c10::intrusive_ptr<c10d::Backend> MakeNcclBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                  std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
}

}  // namespace ftd::engine
