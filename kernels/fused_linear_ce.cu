// Fused linear cross-entropy (lm_head + cross-entropy, forward and backward) without materialising the
// [rows, vocab] logits.
//
// What is fused
//   For each chunk of at most chunk_rows rows [r0, r0 + n):
//     1. logits_c = x_c W^T                      cuBLAS, fp32 accumulation, stored in `dtype` in the workspace
//     2. loss, lse of the chunk                  CrossEntropyForward on the workspace
//     3. dlogits_c = s * (softmax - onehot)      CrossEntropyBackward in place over the workspace
//     4. dweight (+)= dlogits_c^T x_c            cuBLAS (beta 0 on the first chunk unless accumulate_dweight);
//                                                skipped when dweight is nullptr (a frozen weight)
//     5. dx_c = dlogits_c W                      cuBLAS
//   Step 4 runs before step 5 so that dx may alias x: x_c is last read before dx_c is written.
//   The only [*, vocab] buffer is the workspace chunk; the gradients are final when the call returns.
//
// Shapes, dtypes, layout (all device pointers; T = fp32 or bf16 by DType)
//   x:          (rows, hidden) T, row-major                         read
//   weight:     (vocab, hidden) T, row-major (HF lm_head.weight)    read
//   labels:     (rows) int64                                        read
//   loss, lse:  (rows) fp32                                         (=), as CrossEntropyForward
//   dx:         (rows, hidden) T                                    (=); may alias x
//   dweight:    (vocab, hidden) T                                   (=) or (+=) with accumulate_dweight;
//               nullptr: not computed
//   grad_scale: fp32 scalar s or nullptr (s = 1); the gradients are those of sum_r s * loss[r]
//   workspace:  >= FusedLinearCrossEntropyWorkspaceBytes bytes, 16-byte aligned: the chunk's logits,
//               (chunk, ldc) T with ldc = vocab rounded up to 16 bytes so every row is vector-aligned
//
// Precision
//   GEMMs accumulate in fp32 (CUBLAS_COMPUTE_32F; the handle's math mode applies, so fp32 is exact
//   fp32 unless the caller enabled TF32 on it). The chunk logits are rounded to T before the softmax
//   and dlogits to T before steps 4-5, as the eager path (bf16 linear, then .float() cross-entropy,
//   bf16 gradient) does. dweight accumulates across chunks in T: with bf16 each chunk adds one
//   rounding (2^-8 relative), rows / chunk_rows of them in all; eager rounds once.
//   Cross-entropy arithmetic is that of kernels/cross_entropy.cu (fp32, ~1e-6).
//
// Sizes and alignment
//   Any rows >= 0, hidden >= 1, vocab >= 1; cuBLAS takes hidden, vocab, chunk and ldc as int.
//   Pointers aligned to their element size; cuBLAS picks slower kernels when rows of x or W are not
//   16-byte aligned (hidden not a multiple of 8 bf16 / 4 fp32).
#include "kernels/fused_linear_ce.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cross_entropy.h"

namespace ftd::kernels {
namespace {

cudaError_t FromCublas(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return cudaSuccess;
    case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: return cudaErrorNotSupported;
    case CUBLAS_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_EXECUTION_FAILED: return cudaErrorLaunchFailure;
    default: return cudaErrorUnknown;
  }
}

// Sets host pointer mode (alpha and beta below live on the host) and restores the caller's on exit.
class HostPointerMode {
 public:
  explicit HostPointerMode(cublasHandle_t h) : h_(h) {
    status_ = cublasGetPointerMode(h_, &saved_);
    if (status_ == CUBLAS_STATUS_SUCCESS && saved_ != CUBLAS_POINTER_MODE_HOST) {
      status_ = cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_HOST);
      restore_ = status_ == CUBLAS_STATUS_SUCCESS;
    }
  }
  ~HostPointerMode() {
    if (restore_) cublasSetPointerMode(h_, saved_);
  }
  HostPointerMode(const HostPointerMode&) = delete;
  HostPointerMode& operator=(const HostPointerMode&) = delete;
  cublasStatus_t status() const { return status_; }

 private:
  cublasHandle_t h_;
  cublasPointerMode_t saved_ = CUBLAS_POINTER_MODE_HOST;
  cublasStatus_t status_;
  bool restore_ = false;
};

// Row stride of the workspace logits: vocab rounded up to a whole number of 16-byte vectors.
int64_t ChunkLd(DType dtype, int64_t vocab) {
  const int64_t per_vec = 16 / static_cast<int64_t>(DTypeSize(dtype));
  return (vocab + per_vec - 1) / per_vec * per_vec;
}

bool AlignedTo(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

size_t FusedLinearCrossEntropyWorkspaceBytes(DType dtype, int64_t rows, int64_t hidden, int64_t vocab,
                                             int64_t chunk_rows) {
  if (rows < 0 || hidden < 1 || vocab < 1 || chunk_rows < 1) return 0;
  const int64_t chunk = std::min(chunk_rows, rows);
  return static_cast<size_t>(chunk) * static_cast<size_t>(ChunkLd(dtype, vocab)) * DTypeSize(dtype);
}

cudaError_t FusedLinearCrossEntropy(cublasHandle_t handle, DType dtype, const void* x, const void* weight,
                                    const int64_t* labels, float* loss, float* lse, void* dx, void* dweight,
                                    bool accumulate_dweight, const float* grad_scale, void* workspace,
                                    size_t workspace_bytes, int64_t rows, int64_t hidden, int64_t vocab,
                                    int64_t chunk_rows, int64_t ignore_index, cudaStream_t stream) {
  if (handle == nullptr || rows < 0 || hidden < 1 || vocab < 1 || chunk_rows < 1) return cudaErrorInvalidValue;
  const size_t es = DTypeSize(dtype);
  const int64_t chunk = std::min(chunk_rows, rows);
  const int64_t ldc = ChunkLd(dtype, vocab);
  if (hidden > INT_MAX || ldc > INT_MAX || chunk > INT_MAX) return cudaErrorInvalidValue;
  if (weight == nullptr || !AlignedTo(weight, es) || (dweight != nullptr && !AlignedTo(dweight, es))) {
    return cudaErrorInvalidValue;
  }
  if (rows > 0) {
    if (x == nullptr || labels == nullptr || loss == nullptr || lse == nullptr || dx == nullptr) {
      return cudaErrorInvalidValue;
    }
    if (!AlignedTo(x, es) || !AlignedTo(dx, es)) return cudaErrorInvalidValue;
    if (workspace == nullptr || !AlignedTo(workspace, 16) ||
        workspace_bytes < FusedLinearCrossEntropyWorkspaceBytes(dtype, rows, hidden, vocab, chunk_rows)) {
      return cudaErrorInvalidValue;
    }
  }

  cudaStream_t current = nullptr;
  cublasStatus_t st = cublasGetStream(handle, &current);
  if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
  if (current != stream) {
    st = cublasSetStream(handle, stream);
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
  }
  if (rows == 0) {
    // No rows: the gradient of the (empty) loss is zero.
    if (accumulate_dweight || dweight == nullptr) return cudaSuccess;
    return cudaMemsetAsync(dweight, 0, static_cast<size_t>(vocab) * static_cast<size_t>(hidden) * es, stream);
  }

  HostPointerMode pointer_mode(handle);
  if (pointer_mode.status() != CUBLAS_STATUS_SUCCESS) return FromCublas(pointer_mode.status());
  const cudaDataType_t type = dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const float one = 1.f, zero = 0.f;
  const int h = static_cast<int>(hidden), v = static_cast<int>(vocab), ld = static_cast<int>(ldc);
  const auto* x_bytes = static_cast<const char*>(x);
  auto* dx_bytes = static_cast<char*>(dx);

  // cuBLAS is column-major: a row-major (a, b) matrix with row stride ld is a column-major (b, a)
  // matrix with leading dimension ld. So x_c is (h, n), W is (h, v), the logits chunk is (v, n) with
  // leading dimension ldc, dx_c is (h, n) and dweight is (h, v).
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int n = static_cast<int>(std::min(chunk, rows - r0));
    const void* xc = x_bytes + static_cast<size_t>(r0 * hidden) * es;
    void* dxc = dx_bytes + static_cast<size_t>(r0 * hidden) * es;

    // 1. logits^T (v, n) = W^T(h, v)^T . x_c (h, n)
    st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, v, n, h, &one, weight, type, h, xc, type, h, &zero,
                      workspace, type, ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);

    // 2-3. loss and lse of the chunk, then dlogits = s * (softmax - onehot) over the logits.
    cudaError_t e = CrossEntropyForward(dtype, workspace, ldc, labels + r0, loss + r0, lse + r0, n, vocab,
                                        ignore_index, stream);
    if (e != cudaSuccess) return e;
    e = CrossEntropyBackward(dtype, workspace, ldc, labels + r0, lse + r0, grad_scale, 0, workspace, ldc, n, vocab,
                             ignore_index, stream);
    if (e != cudaSuccess) return e;

    // 4. dweight^T (h, v) (+)= x_c (h, n) . dlogits^T(v, n)^T
    if (dweight != nullptr) {
      const float* beta = (r0 == 0 && !accumulate_dweight) ? &zero : &one;
      st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, h, v, n, &one, xc, type, h, workspace, type, ld, beta,
                        dweight, type, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
    }

    // 5. dx_c^T (h, n) = W^T (h, v) . dlogits^T (v, n)
    st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, h, n, v, &one, weight, type, h, workspace, type, ld, &zero,
                      dxc, type, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
  }
  return cudaGetLastError();
}

}  // namespace ftd::kernels
