// Names for the Communicator interface's enums.
#include "comm/communicator.h"

namespace tandem {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "avg"; }

}  // namespace tandem
