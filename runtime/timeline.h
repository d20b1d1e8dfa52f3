// A stream's time cut into named phases by events, never by host clocks around calls: a
// phase runs from one mark to the next as the stream reached them, so on a GPU it is the
// device's time (kernels, and the waits the stream made for other streams), not the time the
// host took to issue the work. Training steps are timed this way (compute, exposed
// communication, pipeline bubble, optimizer), and the trace's spans are the same phases.
#ifndef TANDEM_RUNTIME_TIMELINE_H_
#define TANDEM_RUNTIME_TIMELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/stream.h"

namespace tandem {

class StreamTimeline {
 public:
  struct Phase {
    std::string name;      // "forward 3", "wait for gradients"
    int kind = 0;          // the caller's category of the phase
    int micro_batch = -1;
    double start_us = 0;   // since TimeOrigin()
    double seconds = 0;
  };

  // Starts a timeline on `s` at the stream's current end of work.
  static absl::StatusOr<StreamTimeline> Start(Stream& s);
  StreamTimeline(StreamTimeline&&) = default;
  StreamTimeline& operator=(StreamTimeline&&) = default;

  // Ends the current phase at the stream's current end of work: the phase from the previous
  // mark (or the start) to here is `name`, of kind `kind`.
  absl::Status Mark(int kind, std::string name, int micro_batch = -1);
  // True once the stream has passed the last mark; never blocks.
  absl::StatusOr<bool> Complete();
  // The phases, in order, once complete.
  absl::StatusOr<std::vector<Phase>> Phases() const;
  // The last mark (the start while there is none): where the next timeline's time starts.
  const Event& end() const { return marks_.empty() ? *start_ : *marks_.back().event; }
  const Event& start() const { return *start_; }

 private:
  struct MarkAt {
    std::unique_ptr<Event> event;
    std::string name;
    int kind;
    int micro_batch;
  };
  explicit StreamTimeline(Stream& s) : stream_(&s) {}
  Stream* stream_;
  std::unique_ptr<Event> start_;
  std::vector<MarkAt> marks_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TIMELINE_H_
