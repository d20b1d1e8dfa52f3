// The phases of a training step on the compute stream (StreamTimeline kinds): the trainer,
// its gradient synchronization and the pipeline executor mark them; StepTiming adds them up.
#ifndef TANDEM_PARALLEL_STEP_PHASES_H_
#define TANDEM_PARALLEL_STEP_PHASES_H_

namespace tandem {

enum StepPhase {
  kCompute,      // forward, backward, weight gradients
  kExposedComm,  // the stream waiting for gradient or loss reductions
  kBubble,       // pipeline: waiting on another stage
  kOptimizer,    // gradient norm, clipping and the update
  kInput,        // waiting for a micro-batch's copy to the device
  // Tensor parallelism, inside a compute action: its compute up to one of the blocks'
  // collectives (the action's next kCompute mark ends the rest), and the stream waiting for
  // that collective.
  kComputePart,
  kTensorComm,
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_STEP_PHASES_H_
