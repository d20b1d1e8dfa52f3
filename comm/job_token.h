// The job's secret: a random token made by the launcher for each job, handed to workers in
// the environment (never on a command line) and sent with every coordinator request.
#ifndef TANDEM_COMM_JOB_TOKEN_H_
#define TANDEM_COMM_JOB_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Environment variables through which the launcher tells workers where the coordinator is
// and what the token is.
inline constexpr char kCoordinatorAddressEnv[] = "TANDEM_COORDINATOR";
inline constexpr char kJobTokenEnv[] = "TANDEM_JOB_TOKEN";
// The gRPC metadata entry carrying the token.
inline constexpr char kTokenMetadataKey[] = "x-tandem-token";
// Tokens shorter than this are refused (a guessable secret is no secret).
inline constexpr size_t kMinTokenLength = 16;

// 32 bytes from the kernel's random source, as 64 hex digits.
absl::StatusOr<std::string> GenerateJobToken();

// Compares in time that depends only on the lengths, not on where the strings differ.
bool TokensEqual(absl::string_view a, absl::string_view b);

}  // namespace tandem

#endif  // TANDEM_COMM_JOB_TOKEN_H_
