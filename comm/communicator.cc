// Names for the Communicator interface's enums.
#include "comm/communicator.h"

namespace tandem {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

}  // namespace tandem
