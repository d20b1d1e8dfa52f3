#include "runtime/stream.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

#if TANDEM_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_status.h"
#endif

namespace tandem {

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(Device d) {
  if (d.is_cpu()) return std::unique_ptr<Stream>(new Stream(d, nullptr));
#if TANDEM_CUDA
  RETURN_IF_ERROR(SetCurrentDevice(d));
  cudaStream_t s;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<Stream>(new Stream(d, s));
#else
  return NoCudaBackendError(d);
#endif
}

absl::StatusOr<Stream*> Stream::Compute(Device d) {
  static std::mutex mu;
  static auto* streams = new std::map<std::pair<int, int>, std::unique_ptr<Stream>>();
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(static_cast<int>(d.type()), d.index());
  auto it = streams->find(key);
  if (it != streams->end()) return it->second.get();
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> s, Create(d));
  Stream* raw = s.get();
  (*streams)[key] = std::move(s);
  return raw;
}

Stream::~Stream() {
#if TANDEM_CUDA
  if (native_) cudaStreamDestroy(static_cast<cudaStream_t>(native_));
#endif
}

absl::Status Stream::Synchronize() {
#if TANDEM_CUDA
  if (native_) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Event>> Event::Create(Device d, bool timing) {
  if (d.is_cpu()) return std::unique_ptr<Event>(new Event(d, nullptr));
#if TANDEM_CUDA
  RETURN_IF_ERROR(SetCurrentDevice(d));
  cudaEvent_t e;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, timing ? 0 : cudaEventDisableTiming));
  return std::unique_ptr<Event>(new Event(d, e));
#else
  (void)timing;
  return NoCudaBackendError(d);
#endif
}

Event::~Event() {
#if TANDEM_CUDA
  if (native_) cudaEventDestroy(static_cast<cudaEvent_t>(native_));
#endif
}

absl::Status Event::Record(Stream& stream) {
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("event on ", device_.ToString(),
                                                   " recorded on a stream of ",
                                                   stream.device().ToString()));
  }
  recorded_ = true;
  cpu_time_ = std::chrono::steady_clock::now();
#if TANDEM_CUDA
  if (native_) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(native_),
                                         static_cast<cudaStream_t>(stream.native())));
  }
#endif
  return absl::OkStatus();
}

absl::Status Event::MakeStreamWait(Stream& stream) {
#if TANDEM_CUDA
  if (native_ && stream.native()) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()),
                                             static_cast<cudaEvent_t>(native_), 0));
  }
#endif
  (void)stream;
  return absl::OkStatus();
}

absl::Status Event::Synchronize() {
#if TANDEM_CUDA
  if (native_) CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() {
#if TANDEM_CUDA
  if (native_) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(native_));
    if (e == cudaErrorNotReady) {
      // Not an error, but the runtime records it as the thread's last one, where the next
      // kernel launch's check would find it; cleared as PyTorch's CUDAEvent::query does.
      (void)cudaGetLastError();
      return false;
    }
    CUDA_RETURN_IF_ERROR(e);
  }
#endif
  return true;
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  if (!recorded_ || !start.recorded_) {
    return absl::FailedPreconditionError("elapsed time asked of an event never recorded");
  }
#if TANDEM_CUDA
  if (native_) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.native_),
                                              static_cast<cudaEvent_t>(native_)));
    return ms;
  }
#endif
  return std::chrono::duration<float, std::milli>(cpu_time_ - start.cpu_time_).count();
}

}  // namespace tandem
