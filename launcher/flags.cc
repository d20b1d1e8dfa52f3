#include "launcher/flags.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace launcher {
namespace {

std::string Hyphenated(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

// True for words that look like a flag: "-x", "--x", "--x=v" (not "-", "--" or a number).
bool LooksLikeFlag(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg == "--") return false;
  const char c = arg[arg[1] == '-' ? 2 : 1];
  return c != '\0' && !absl::ascii_isdigit(c) && c != '.';
}

struct FlagWord {
  std::string dashes;
  std::string name;  // as written
  bool has_value = false;
  std::string value;
};

FlagWord SplitFlagWord(absl::string_view arg) {
  FlagWord w;
  const size_t dashes = absl::StartsWith(arg, "--") ? 2 : 1;
  w.dashes = std::string(arg.substr(0, dashes));
  absl::string_view rest = arg.substr(dashes);
  const size_t eq = rest.find('=');
  w.name = std::string(rest.substr(0, eq));
  if (eq != absl::string_view::npos) {
    w.has_value = true;
    w.value = std::string(rest.substr(eq + 1));
  }
  return w;
}

// True for a word that may be the value of the flag before it: anything but "--" and the
// program's own flags (and --help): "--data -file", "--mpirun-args --oversubscribe" and
// "--mpirun-args '--mca btl tcp'" take theirs; "--model --check" is --model without one.
bool CanBeValue(const FlagSet& flags, absl::string_view word) {
  if (word == "--") return false;
  if (!LooksLikeFlag(word) || word.find_first_of(" \t") != absl::string_view::npos) return true;
  const std::string name = SplitFlagWord(RewriteFlagName(word)).name;
  if (name == "help" || name == "h" || name == "helpfull" || flags.Find(name) != nullptr) {
    return false;
  }
  const absl::CommandLineFlag* positive =
      absl::StartsWith(name, "no") ? flags.Find(name.substr(2)) : nullptr;
  return positive == nullptr || !positive->IsOfType<bool>();
}

// True when the flag named by this (rewritten) word takes the next word as its value.
bool TakesNextWord(const FlagSet& flags, const FlagWord& w) {
  if (w.has_value) return false;
  const absl::CommandLineFlag* f = flags.Find(w.name);
  return f != nullptr && !f->IsOfType<bool>();
}

// The flag's default in this program: FlagSet::defaults', else its definition's.
std::string DefaultOf(const FlagSet& flags, const absl::CommandLineFlag& f) {
  for (const auto& [name, value] : flags.defaults) {
    if (name == f.Name()) return value;
  }
  return f.DefaultValue();
}

std::string TypeWord(const absl::CommandLineFlag& f) {
  if (f.IsOfType<int>()) return "an integer";
  if (f.IsOfType<uint64_t>()) return "a non-negative integer";
  if (f.IsOfType<double>()) return "a number";
  if (f.IsOfType<bool>()) return "true or false";
  return "a value";
}

}  // namespace

absl::CommandLineFlag* FlagSet::Find(absl::string_view name) const {
  absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  if (f == nullptr) return nullptr;
  if (absl::EndsWith(f->Filename(), defined_in)) return f;
  for (const std::string& file : shared_from) {
    if (absl::EndsWith(f->Filename(), file)) {
      return std::find(names.begin(), names.end(), name) != names.end() ? f : nullptr;
    }
  }
  return nullptr;
}

std::string RewriteFlagName(absl::string_view arg) {
  if (!LooksLikeFlag(arg)) return std::string(arg);
  FlagWord w = SplitFlagWord(arg);
  std::string name = w.name;
  if (absl::StartsWith(name, "no-")) name = "no" + name.substr(3);
  name = absl::StrReplaceAll(name, {{"-", "_"}});
  return absl::StrCat(w.dashes, name, w.has_value ? "=" : "", w.value);
}

std::vector<std::string> RewriteArgs(const FlagSet& flags, const std::vector<std::string>& args) {
  std::vector<std::string> out;
  bool rest_verbatim = false, next_is_value = false;
  for (const std::string& a : args) {
    if (rest_verbatim || (next_is_value && CanBeValue(flags, a)) || !LooksLikeFlag(a)) {
      next_is_value = false;
      if (a == "--") rest_verbatim = true;
      out.push_back(a);
      continue;
    }
    out.push_back(RewriteFlagName(a));
    next_is_value = TakesNextWord(flags, SplitFlagWord(out.back()));
  }
  return out;
}

absl::Status ParseFlags(const FlagSet& flags, const std::vector<std::string>& raw_args,
                        bool* help) {
  *help = false;
  std::vector<std::string> problems;
  for (const auto& [name, value] : flags.defaults) {
    absl::CommandLineFlag* f = flags.Find(name);
    std::string error;
    if (f == nullptr || !f->ParseFrom(value, &error)) {
      problems.push_back(absl::StrFormat(
          "the default --%s=%s is not a valid value of one of the program's flags",
          Hyphenated(name), value));
    }
  }
  const std::vector<std::string> args = RewriteArgs(flags, raw_args);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      for (size_t j = i + 1; j < args.size(); ++j) {
        problems.push_back(absl::StrFormat("unexpected argument '%s'", args[j]));
      }
      break;
    }
    if (!LooksLikeFlag(a)) {
      problems.push_back(absl::StrFormat(
          "unexpected argument '%s': flags are written --name=value (see --help)", a));
      continue;
    }
    const FlagWord w = SplitFlagWord(a);
    // How the user wrote it, for messages.
    const std::string shown = LooksLikeFlag(raw_args[i]) ? SplitFlagWord(raw_args[i]).name
                                                          : Hyphenated(w.name);
    if (w.name == "help" || w.name == "h" || w.name == "helpfull") {
      *help = true;
      continue;
    }
    absl::CommandLineFlag* f = flags.Find(w.name);
    std::string value = w.value;
    if (f == nullptr && absl::StartsWith(w.name, "no")) {
      absl::CommandLineFlag* positive = flags.Find(w.name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) {
        if (w.has_value) {
          problems.push_back(absl::StrFormat("--%s takes no value", shown));
          continue;
        }
        f = positive;
        value = "false";
      }
    }
    if (f == nullptr) {
      problems.push_back(absl::StrFormat("unknown flag --%s (see --help)", shown));
      continue;
    }
    if (!w.has_value && value.empty()) {
      if (f->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < args.size() && CanBeValue(flags, raw_args[i + 1])) {
        value = args[++i];
      } else {
        const std::string type = TypeWord(*f);
        problems.push_back(absl::StrFormat("--%s needs a value%s: --%s=VALUE", shown,
                                           type == "a value" ? "" : " (" + type + ")", shown));
        continue;
      }
    }
    std::string error;
    if (!f->ParseFrom(value, &error)) {
      problems.push_back(
          absl::StrFormat("--%s=%s: not a valid value; expected %s", shown, value, TypeWord(*f)));
    }
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  return absl::OkStatus();
}

int ParseCommandLine(const FlagSet& flags, int argc, char** argv, const char* program,
                     const std::string& usage) {
  bool help = false;
  const absl::Status parsed =
      ParseFlags(flags, std::vector<std::string>(argv + 1, argv + argc), &help);
  if (help) {
    std::fputs(HelpText(flags, usage).c_str(), stdout);
    return 0;
  }
  if (parsed.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(parsed.message(), '\n')) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(line).c_str());
  }
  return 2;
}

std::string HelpText(const FlagSet& flags, const std::string& usage) {
  std::string out = absl::StrCat(usage, "\nFlags:\n");
  for (const std::string& name : flags.names) {
    const absl::CommandLineFlag* f = flags.Find(name);
    if (f == nullptr) continue;
    std::string shown = "--" + Hyphenated(name);
    std::string def = DefaultOf(flags, *f);
    if (f->IsOfType<bool>()) {
      shown = "--[no-]" + Hyphenated(name);
    } else if (f->IsOfType<std::string>()) {
      def = def.empty() ? "\"\"" : def;
    }
    absl::StrAppendFormat(&out, "  %s  (default: %s)\n      %s\n", shown, def, f->Help());
  }
  absl::StrAppend(&out, "  --help\n      this listing\n");
  return out;
}

}  // namespace launcher
}  // namespace tandem
