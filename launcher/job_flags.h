// The job's model and training flags, defined once (launcher/job_flags.cc) for every program
// that takes them: the launcher, examples/train and compare --plan. A program lists the ones
// it takes in its FlagSet (launcher/flags.h), beside its own, with `shared_from` naming
// kJobFlagsFile, and reads their values with JobFlagsInto.
#ifndef TANDEM_LAUNCHER_JOB_FLAGS_H_
#define TANDEM_LAUNCHER_JOB_FLAGS_H_

#include <string>
#include <vector>

#include "parallel/job.h"

namespace tandem {
namespace launcher {

// The file that defines them, from the workspace root (FlagSet::shared_from).
inline constexpr char kJobFlagsFile[] = "launcher/job_flags.cc";

// Their names, underscored, as defined, in the launcher's --help order.
const std::vector<std::string>& JobFlagNames();

// Their current values into `job` (model, dtype, steps, batch, optimizer, seed, data,
// validation, checkpoint_every; the rest of `job` is left as it is), with --eval-every
// resolved (JobConfig::ResolveEvalEvery). Paths are as typed.
void JobFlagsInto(JobConfig* job);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_JOB_FLAGS_H_
