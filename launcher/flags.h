// Command lines as Tandem's programs take them: Abseil flags written with hyphens
// (--micro-batches=4, --no-overlap), every problem found said in one line each, and a --help
// listing of the program's own flags only (not those of the libraries it links).
#ifndef TANDEM_LAUNCHER_FLAGS_H_
#define TANDEM_LAUNCHER_FLAGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {
namespace launcher {

// A program's flags: the ABSL_FLAGs its own source file defines, and those of files of
// flags several programs share (launcher/job_flags.h) that it takes.
struct FlagSet {
  std::string defined_in;          // the program's file, its path from the workspace root
  std::vector<std::string> names;  // underscored, as defined, in --help order (shared ones too)
  // Files of shared flags (paths from the workspace root): of their flags, the program takes
  // those in `names`.
  std::vector<std::string> shared_from = {};
  // (name, value): the program's default for a shared flag where it is not the definition's.
  // ParseFlags sets these before reading the command line; HelpText shows them.
  std::vector<std::pair<std::string, std::string>> defaults = {};
  // The flag `name` (underscored) when it is one of these; else nullptr.
  absl::CommandLineFlag* Find(absl::string_view name) const;
};

// Rewrites one command-line word's flag name for Abseil: hyphens in the name become
// underscores ("--micro-batches=4" -> "--micro_batches=4") and "--no-x" becomes "--nox".
// The value part (after '=') is never changed; words that are not flags are returned as is.
std::string RewriteFlagName(absl::string_view arg);
// RewriteFlagName over a command line (without argv[0]); a word that is the value of the
// previous flag ("--data my-file") and everything after "--" are left alone.
std::vector<std::string> RewriteArgs(const FlagSet& flags, const std::vector<std::string>& args);

// Parses the command line (without argv[0]) into `flags`. Sets *help when --help (or -h) was
// given. An error's message holds one line per problem (unknown flag, bad or missing value,
// stray argument), every problem found. A flag's value is never "--" or one of the
// program's own flags: "--model --steps=3" is --model without a value, not
// --model=--steps=3; --mpirun-args --oversubscribe takes its value.
absl::Status ParseFlags(const FlagSet& flags, const std::vector<std::string>& args, bool* help);

// `usage` (lines ending in '\n'), then every flag with its hyphenated name, default and help.
std::string HelpText(const FlagSet& flags, const std::string& usage);

// A program's command line (argv[1..]) parsed into `flags`: with --help, prints HelpText to
// stdout and returns 0; on a problem, prints each as "<program>: <problem>" to stderr and
// returns 2 (a usage error); else returns -1: the program goes on.
int ParseCommandLine(const FlagSet& flags, int argc, char** argv, const char* program,
                     const std::string& usage);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_FLAGS_H_
