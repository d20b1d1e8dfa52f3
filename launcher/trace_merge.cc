// Reading the workers' Chrome traces back (through a small recursive-descent JSON parser),
// aligning their clocks on the per-step loss all-reduce, writing the merged trace, and
// printing the op tables at the end of a --profile run.
#include "launcher/trace_merge.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/report.h"
#include "runtime/files.h"

namespace tandem {
namespace launcher {

// ---- JSON ----

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

double JsonValue::NumberOr(absl::string_view key, double fallback) const {
  const JsonValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->kind == Kind::kNumber) return v->number;
  if (v->kind == Kind::kBool) return v->boolean ? 1 : 0;
  return fallback;
}

std::string JsonValue::StringOr(absl::string_view key, const std::string& fallback) const {
  const JsonValue* v = Find(key);
  return v != nullptr && v->kind == Kind::kString ? v->string : fallback;
}

namespace {

constexpr int kMaxDepth = 64;

class JsonParser {
 public:
  explicit JsonParser(absl::string_view s) : s_(s) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue v;
    if (absl::Status st = Value(&v, 0); !st.ok()) return st;
    Skip();
    if (i_ != s_.size()) return Error("text after the document");
    return v;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat("JSON: %s at offset %d", what, i_));
  }

  void Skip() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }

  bool Literal(absl::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool Hex4(uint32_t* cp) {
    if (i_ + 4 > s_.size()) return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        return false;
    }
    i_ += 4;
    *cp = v;
    return true;
  }

  absl::Status String(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return Error("expected a string");
    ++i_;
    out->clear();
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) break;
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return Error("bad \\u escape");
          if (cp >= 0xD800 && cp < 0xDC00 && Literal("\\u")) {  // a surrogate pair
            uint32_t low;
            if (!Hex4(&low) || low < 0xDC00 || low >= 0xE000) return Error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
    if (i_ >= s_.size()) return Error("unterminated string");
    ++i_;
    return absl::OkStatus();
  }

  absl::Status Value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    Skip();
    if (i_ >= s_.size()) return Error("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v->kind = JsonValue::Kind::kObject;
      Skip();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return absl::OkStatus();
      }
      for (;;) {
        Skip();
        std::string key;
        if (absl::Status st = String(&key); !st.ok()) return st;
        Skip();
        if (i_ >= s_.size() || s_[i_] != ':') return Error("expected ':'");
        ++i_;
        JsonValue member;
        if (absl::Status st = Value(&member, depth + 1); !st.ok()) return st;
        v->object.emplace_back(std::move(key), std::move(member));
        Skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return absl::OkStatus();
        }
        return Error("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++i_;
      v->kind = JsonValue::Kind::kArray;
      Skip();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return absl::OkStatus();
      }
      for (;;) {
        JsonValue item;
        if (absl::Status st = Value(&item, depth + 1); !st.ok()) return st;
        v->array.push_back(std::move(item));
        Skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return absl::OkStatus();
        }
        return Error("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v->kind = JsonValue::Kind::kString;
      return String(&v->string);
    }
    if (Literal("true")) {
      v->kind = JsonValue::Kind::kBool;
      v->boolean = true;
      return absl::OkStatus();
    }
    if (Literal("false")) {
      v->kind = JsonValue::Kind::kBool;
      return absl::OkStatus();
    }
    if (Literal("null")) {
      v->kind = JsonValue::Kind::kNull;
      return absl::OkStatus();
    }
    size_t end = i_;
    while (end < s_.size() && (absl::ascii_isdigit(s_[end]) || s_[end] == '-' || s_[end] == '+' ||
                               s_[end] == '.' || s_[end] == 'e' || s_[end] == 'E')) {
      ++end;
    }
    double d;
    if (end == i_ || !absl::SimpleAtod(s_.substr(i_, end - i_), &d)) {
      return Error("expected a value");
    }
    i_ = end;
    v->kind = JsonValue::Kind::kNumber;
    v->number = d;
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t i_ = 0;
};

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return JsonParser(text).Document(); }

absl::StatusOr<JsonValue> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<JsonValue> v = ParseJson(*text);
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", v.status().message()));
  return v;
}

// ---- traces ----

absl::StatusOr<RankTrace> ParseChromeTrace(absl::string_view text) {
  absl::StatusOr<JsonValue> doc = ParseJson(text);
  if (!doc.ok()) return doc.status();
  const JsonValue* events = doc->Find("traceEvents");
  if (events == nullptr || !events->is_array()) {
    return absl::InvalidArgumentError("not a Chrome trace: no \"traceEvents\" array");
  }
  RankTrace t;
  bool have_pid = false;
  for (const JsonValue& e : events->array) {
    if (!e.is_object()) continue;
    if (!have_pid && e.Find("pid") != nullptr) {
      t.rank = static_cast<int>(e.NumberOr("pid", 0));
      have_pid = true;
    }
    if (e.StringOr("ph", "") != "X") continue;
    TraceEvent ev;
    ev.name = e.StringOr("name", "");
    ev.category = e.StringOr("cat", "");
    ev.start_us = e.NumberOr("ts", 0);
    ev.duration_us = e.NumberOr("dur", 0);
    ev.thread = static_cast<int>(e.NumberOr("tid", 0));
    if (const JsonValue* args = e.Find("args")) {
      ev.micro_batch = static_cast<int>(args->NumberOr("micro_batch", -1));
      ev.sequence = static_cast<int64_t>(args->NumberOr("sequence", -1));
    }
    t.events.push_back(std::move(ev));
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  return t;
}

absl::StatusOr<RankTrace> ReadRankTrace(const std::string& run_dir, int rank) {
  const std::string path = absl::StrFormat("%s/traces/rank-%d.json", run_dir, rank);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<RankTrace> t = ParseChromeTrace(*text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  t->rank = rank;
  return t;
}

std::vector<double> ClockOffsetsUs(const std::vector<RankTrace>& ranks) {
  auto sync_points = [](const RankTrace& t) {
    std::vector<double> ends;
    for (const TraceEvent& e : t.events) {
      if (e.name == "reduce loss") ends.push_back(e.start_us + e.duration_us);
    }
    return ends;
  };
  std::vector<double> offsets(ranks.size(), 0.0);
  if (ranks.empty()) return offsets;
  const std::vector<double> ref = sync_points(ranks[0]);
  for (size_t r = 1; r < ranks.size(); ++r) {
    const std::vector<double> mine = sync_points(ranks[r]);
    std::vector<double> diffs;
    for (size_t i = 0; i < std::min(ref.size(), mine.size()); ++i)
      diffs.push_back(ref[i] - mine[i]);
    offsets[r] = Median(diffs);
  }
  return offsets;
}

RankTrace Shifted(const RankTrace& trace, double offset_us) {
  RankTrace out = trace;
  for (TraceEvent& e : out.events) e.start_us += offset_us;
  return out;
}

std::string MergedChromeTrace(const std::vector<RankTrace>& ranks) {
  std::string out = "{\"traceEvents\": [";
  bool first = true;
  auto add = [&](const std::string& line) {
    absl::StrAppend(&out, first ? "\n" : ",\n", line);
    first = false;
  };
  for (const RankTrace& t : ranks) {
    const int pid = t.rank;
    add(absl::StrFormat(
        "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": "
        "\"rank %d\"}}",
        pid, pid));
    add(
        absl::StrFormat("{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %d, \"args\": "
                        "{\"sort_index\": %d}}",
                        pid, pid));
    add(absl::StrFormat(
        "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": 0, \"args\": "
        "{\"name\": \"compute\"}}",
        pid));
    add(absl::StrFormat(
        "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": 1, \"args\": "
        "{\"name\": \"communication\"}}",
        pid));
  }
  for (const RankTrace& t : ranks) {
    for (const TraceEvent& e : t.events) {
      add(absl::StrFormat(
          "{\"ph\": \"X\", \"name\": %s, \"cat\": %s, \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
          "\"dur\": %.3f, \"args\": {\"micro_batch\": %d, \"sequence\": %d}}",
          JsonWriter::Quote(e.name), JsonWriter::Quote(e.category), t.rank, e.thread, e.start_us,
          e.duration_us, e.micro_batch, e.sequence));
    }
  }
  return out + "\n]}\n";
}

absl::StatusOr<std::vector<RankTrace>> ReadAlignedTraces(const std::string& run_dir,
                                                         int workers) {
  std::vector<RankTrace> ranks;
  for (int r = 0; r < workers; ++r) {
    absl::StatusOr<RankTrace> t = ReadRankTrace(run_dir, r);
    if (!t.ok()) return t.status();
    ranks.push_back(std::move(*t));
  }
  const std::vector<double> offsets = ClockOffsetsUs(ranks);
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = Shifted(ranks[r], offsets[r]);
  return ranks;
}

absl::Status MergeRunTraces(const std::string& run_dir, int workers) {
  absl::StatusOr<std::vector<RankTrace>> ranks = ReadAlignedTraces(run_dir, workers);
  if (!ranks.ok()) return ranks.status();
  return WriteFileAtomically(absl::StrCat(run_dir, "/trace.json"), MergedChromeTrace(*ranks));
}

std::string OpTables(const std::string& run_dir, int workers) {
  std::string out;
  for (int r = 0; r < workers; ++r) {
    absl::StatusOr<std::string> table =
        ReadWholeFile(absl::StrFormat("%s/traces/ops-rank-%d.txt", run_dir, r));
    if (!table.ok() || table->empty()) continue;
    absl::StrAppendFormat(&out, "op table, rank %d:\n%s", r, *table);
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

void FinishProfile(const std::string& run_dir, int workers, std::FILE* out, std::FILE* err) {
  const std::string tables = OpTables(run_dir, workers);
  if (!tables.empty()) std::fprintf(out, "\n%s", tables.c_str());
  absl::Status merged = MergeRunTraces(run_dir, workers);
  if (merged.ok()) {
    std::fprintf(out,
                 "trace       %s/trace.json (Perfetto or chrome://tracing; one lane per rank)\n",
                 run_dir.c_str());
  } else {
    std::fprintf(err, "launcher: no merged trace: %s\n", std::string(merged.message()).c_str());
  }
  std::fflush(out);
  std::fflush(err);
}

}  // namespace launcher
}  // namespace tandem
