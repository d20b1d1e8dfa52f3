#include "runtime/timeline.h"

#include "runtime/status.h"

namespace tandem {

absl::StatusOr<StreamTimeline> StreamTimeline::Start(Stream& s) {
  StreamTimeline t(s);
  ASSIGN_OR_RETURN(t.start_, Event::Create(s.device(), /*timing=*/true));
  RETURN_IF_ERROR(t.start_->Record(s));
  return t;
}

absl::Status StreamTimeline::Mark(int kind, std::string name, int micro_batch) {
  ASSIGN_OR_RETURN(std::unique_ptr<Event> e, Event::Create(stream_->device(), /*timing=*/true));
  RETURN_IF_ERROR(e->Record(*stream_));
  marks_.push_back(MarkAt{std::move(e), std::move(name), kind, micro_batch});
  return absl::OkStatus();
}

absl::StatusOr<bool> StreamTimeline::Complete() {
  return marks_.empty() ? start_->Query() : marks_.back().event->Query();
}

absl::StatusOr<std::vector<StreamTimeline::Phase>> StreamTimeline::Phases() const {
  std::vector<Phase> phases;
  const Event* prev = start_.get();
  ASSIGN_OR_RETURN(double prev_us, prev->MicrosSinceOrigin());
  for (const MarkAt& m : marks_) {
    ASSIGN_OR_RETURN(float ms, m.event->ElapsedMsSince(*prev));
    Phase p;
    p.name = m.name;
    p.kind = m.kind;
    p.micro_batch = m.micro_batch;
    p.start_us = prev_us;
    p.seconds = ms * 1e-3;
    phases.push_back(std::move(p));
    prev_us += ms * 1e3;
    prev = m.event.get();
  }
  return phases;
}

}  // namespace tandem
