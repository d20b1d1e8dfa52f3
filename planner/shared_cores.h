// What the prediction (planner.cc) takes from the shared-cores model beside SharedCoresStep
// (planner.h): processor sharing of the cores among the CPU workers that compute at once.
#ifndef TANDEM_PLANNER_SHARED_CORES_H_
#define TANDEM_PLANNER_SHARED_CORES_H_

#include <vector>

namespace tandem {

// Processor sharing: `n` ranks computing at once on `cores` cores, beside `waiting` ranks
// that each take `waiting_share` of a computing one's turn, progress at this rate each.
double ShareRate(int n, double cores, int waiting = 0, double waiting_share = 0);

// Ranks that each start at `release[i]`, compute `work[i]` seconds sharing `cores` cores as
// ShareRate says, then wait `after[i]`: when the last is done.
double SharedCoresEnd(const std::vector<double>& release, const std::vector<double>& work,
                      const std::vector<double>& after, double cores);

}  // namespace tandem

#endif  // TANDEM_PLANNER_SHARED_CORES_H_
