// Training a small model on one worker and across ranks, and comparing the two: the parity
// checks of parallel/parity_test.cc and parallel/hybrid_test.cc (docs/DESIGN.md, invariant
// 1). Test-only.
#ifndef TANDEM_PARALLEL_PARITY_TESTING_H_
#define TANDEM_PARALLEL_PARITY_TESTING_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/distributed.h"

namespace tandem {

// A 3-layer model (d_model 16, sequence 8) over a batch of 24, divisible by 1 to 4 workers
// and by 1, 4 and 8 micro-batches, trained for `steps` steps with warm-up and weight decay.
TrainConfig ParityConfig(ModelKind kind, int micro_batches, const std::string& optimizer,
                         int steps);

struct Trained {
  std::vector<float> losses;
  std::vector<float> grad_norms;  // each step's, before clipping
  std::map<std::string, std::vector<float>> params;  // this rank's, by name
  // Under tensor parallelism, each of `params`' specs: its part of the whole tensor.
  std::map<std::string, ParamSpec> specs;
};

// The stage's parameters by name, with `losses`.
Trained Collect(const Stage& st, std::vector<float> losses);
// c.steps steps on one worker in one micro-batch (or from c.resume, to c.steps).
Trained TrainOneWorker(TrainConfig c);
// `steps` steps of `pc` on `comm`'s ranks, from checkpoint `resume` when not empty, then a
// checkpoint into `save_dir` when not empty.
Trained TrainDistributed(const ParallelConfig& pc, Communicator* comm, int steps,
                         const std::string& resume = "", const std::string& save_dir = "");

// A run's training losses and its validation losses after the steps EvalDue names.
struct Validated {
  std::vector<float> losses;
  std::vector<std::pair<int, float>> val;  // (steps trained, validation loss)
};
// c.steps steps on one worker in one micro-batch, validating as c says.
Validated TrainOneWorkerValidated(TrainConfig c);
// pc.train.steps steps of `pc` on `comm`'s ranks, then DistributedTrainer::Evaluate after the
// steps EvalDue names.
Validated TrainDistributedValidated(const ParallelConfig& pc, Communicator* comm);
// `pc` across `comm` against one worker's `one`: the same evaluations, each validation loss
// within 1e-5 relative, the training losses within 1e-5 relative; and the training losses
// the same bits as the same run's never evaluating.
void CheckValidationParity(const Validated& one, const ParallelConfig& pc, Communicator* comm,
                           const std::string& name);

// Losses within 1e-5 relative each (the invariant). Weights within `weight_tol` of the
// tensor's largest magnitude (`absolute`: within weight_tol), or relative like the losses
// when weight_tol is 0.
void ExpectClose(const std::vector<float>& want, const std::vector<float>& got,
                 const std::string& what, double weight_tol, int rank, bool absolute = false);
// Every weight of `got` (a rank's stage) close to the same parameter's in `want` (under tensor
// parallelism, to the part of want's whole tensor that got holds).
void ExpectSameWeights(const Trained& want, const Trained& got, const std::string& what,
                       double weight_tol, int rank, bool absolute = false);

// The weight tolerance of a parity check: 1e-5 under SGD; under AdamW 1e-3: summing
// gradients in another order changes them by rounding, and AdamW divides each gradient by
// its own running RMS, so a parameter whose true gradient is zero (the attention key bias:
// softmax ignores a constant added to every key) or nearly so turns that rounding into
// updates of up to the full learning rate (seen: 1.3e-4 at 4 ranks x 2 micro-batches).
double WeightTolerance(const std::string& optimizer);

// With tied embeddings across stages (pc's grid has 2 or more): the last stage's copy of
// "embed.wte" in `got` is the first stage's of the same replica, bit for bit (collective).
void ExpectTiedCopiesEqual(const ParallelConfig& pc, Communicator* comm, const Trained& got);

// pc.train.steps steps of `pc` across `comm` against one worker: losses, gradient norms
// (within 1e-3 of the largest: AdamW makes rounding visible), and weights within
// WeightTolerance, or within `weight_abs_tol` (absolute) when it is positive; tied, the
// copies of the table equal (ExpectTiedCopiesEqual).
void CheckParity(const ParallelConfig& pc, Communicator* comm, const std::string& name,
                 double weight_abs_tol = 0);

// Half of first.train.steps steps in layout `first`, a checkpoint (into a directory under
// TEST_TMPDIR), the other half in layout `second` from it: the losses and weights (within
// `weight_abs_tol`) of one worker's uninterrupted run. A data-parallel layout without ZeRO
// and with data_parallel 1 (the default) is one worker, on rank 0 alone; one over every rank
// says data_parallel = the world size (the trainer ignores it). Collective over `comm`.
void CheckResume(const ParallelConfig& first, const ParallelConfig& second,
                 Communicator* comm, double weight_abs_tol, const std::string& name);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_PARITY_TESTING_H_
