// JSON for every file a run reads or writes (run.json, the metrics lines, Chrome traces, the
// comparison's report.json): nlohmann-json values whose objects keep their members in the
// order they were added, the numbers as the files carry them, the files' layouts, and parsing
// with errors as absl::Status.
#ifndef TANDEM_RUNTIME_JSON_H_
#define TANDEM_RUNTIME_JSON_H_

#include <nlohmann/json.hpp>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// A JSON value; an object lists its members in the order they were added.
using Json = nlohmann::ordered_json;

// `v` as a JSON number: null where JSON has none (nan, infinities); an integer where `v` is
// one (and exact in a double), as 6400 rather than 6400.0; else the double, written in the
// shortest form that reads back as the same double.
Json JsonNumber(double v);
// `v` rounded to `decimals` places (a time in seconds to the microsecond: 6), as JsonNumber.
Json JsonRounded(double v, int decimals);
// A float (a loss, a learning rate, a norm): the shortest decimal that reads back as the same
// float (0.0003, not the 0.000300000014 of its double), as JsonNumber.
Json JsonFloat(float v);

enum class JsonLayout {
  // On one line, ", " between items and ": " after keys: {"step": 3, "loss": 2.5}.
  kLine,
  // Every object's members on lines of their own, indented two spaces a level; an array on
  // one line (an object in it is laid out as any other): run.json, report.json.
  kObjects,
  // The top-level object's members on lines of their own, and the elements of the arrays
  // among them, each on one line: a Chrome trace, one event a line.
  kRows,
};

// `j` as text in `layout`, without a final newline. Strings are escaped as JSON requires;
// bytes that are not UTF-8 become U+FFFD.
std::string JsonText(const Json& j, JsonLayout layout);

// Parses one JSON document (nothing but whitespace after it); the error says where it failed.
absl::StatusOr<Json> ParseJson(absl::string_view text);
// Reads and parses a file; errors name it.
absl::StatusOr<Json> ReadJsonFile(const std::string& path);

// The member `key` of an object: its number (true and false as 1 and 0), or `fallback` when
// `j` is not an object, has no such member or it is of another type (null included).
double NumberOr(const Json& j, absl::string_view key, double fallback);
// The member `key` of an object as a string, `fallback` as NumberOr.
std::string StringOr(const Json& j, absl::string_view key, const std::string& fallback);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_JSON_H_
