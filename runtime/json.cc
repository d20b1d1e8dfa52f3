#include "runtime/json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/files.h"

namespace tandem {
namespace {

// A string or number as JSON text, by nlohmann (escapes, numbers' shortest form).
std::string Scalar(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void Append(const Json& j, JsonLayout layout, int level, std::string* out) {
  if (!j.is_structured()) {
    *out += Scalar(j);
    return;
  }
  const bool object = j.is_object();
  bool open = false;
  if (!j.empty()) {
    switch (layout) {
      case JsonLayout::kLine:
        break;
      case JsonLayout::kObjects:
        open = object;
        break;
      case JsonLayout::kRows:
        open = level == 0 ? object : level == 1 && !object;
        break;
    }
  }
  const std::string indent = "\n" + std::string(2 * (level + 1), ' ');
  out->push_back(object ? '{' : '[');
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out->push_back(',');
    if (open) {
      *out += indent;
    } else if (!first) {
      out->push_back(' ');
    }
    first = false;
    if (object) absl::StrAppend(out, Scalar(Json(it.key())), ": ");
    Append(*it, layout, level + 1, out);
  }
  if (open) absl::StrAppend(out, "\n", std::string(2 * level, ' '));
  out->push_back(object ? '}' : ']');
}

}  // namespace

Json JsonNumber(double v) {
  if (!std::isfinite(v)) return nullptr;
  // Doubles hold every integer up to 2^53 exactly.
  if (std::trunc(v) == v && std::fabs(v) <= 9007199254740992.0) return static_cast<int64_t>(v);
  return v;
}

Json JsonRounded(double v, int decimals) {
  if (!std::isfinite(v)) return nullptr;
  const double scale = std::pow(10.0, decimals);
  return JsonNumber(std::round(v * scale) / scale);
}

Json JsonFloat(float v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf) - 1, v);  // shortest
  *r.ptr = '\0';
  return JsonNumber(std::strtod(buf, nullptr));
}

std::string JsonText(const Json& j, JsonLayout layout) {
  std::string out;
  Append(j, layout, 0, &out);
  return out;
}

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ...": the part
    // after the bracketed id.
    absl::string_view what = e.what();
    const size_t id_end = what.find("] ");
    if (id_end != absl::string_view::npos) what.remove_prefix(id_end + 2);
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", what));
  }
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Json> j = ParseJson(*text);
  if (!j.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", j.status().message()));
  return j;
}

double NumberOr(const Json& j, absl::string_view key, double fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(std::string(key));
  if (it == j.end()) return fallback;
  if (it->is_number()) return it->get<double>();
  if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
  return fallback;
}

std::string StringOr(const Json& j, absl::string_view key, const std::string& fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(std::string(key));
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

}  // namespace tandem
