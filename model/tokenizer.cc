// Byte-level BPE (model/tokenizer.h), after GPT-2's encoder.py: bytes_to_unicode, the
// pre-tokenizing pattern (here by hand, with bytes above 127 taken as letters) and bpe().
#include "model/tokenizer.h"

#include <cctype>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/status.h"

namespace tandem {
namespace {

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {  // the alphabet stays below U+0180
    out->push_back(static_cast<char>(0xe0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

// The code points of UTF-8 `s`; false where it is not UTF-8 of at most three bytes a point.
bool CodePoints(absl::string_view s, std::vector<char32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = s[i];
    const int extra = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : -1;
    if (extra < 0) return false;
    char32_t c = extra == 0 ? b : extra == 1 ? (b & 0x1f) : (b & 0x0f);
    for (int k = 1; k <= extra; ++k) {
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
      c = (c << 6) | (s[i + k] & 0x3f);
    }
    out->push_back(c);
    i += 1 + extra;
  }
  return true;
}

enum class CharClass { kSpace, kLetter, kDigit, kOther };
CharClass ClassOf(unsigned char c) {
  if (std::isspace(c)) return CharClass::kSpace;
  if (std::isalpha(c) || c >= 0x80) return CharClass::kLetter;
  if (std::isdigit(c)) return CharClass::kDigit;
  return CharClass::kOther;
}

// GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<absl::string_view> PreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (text[i] == '\'') {
      bool matched = false;
      for (absl::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
        if (text.substr(i, c.size()) == c) {
          pieces.push_back(text.substr(i, c.size()));
          i += c.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    size_t j = i;
    if (text[j] == ' ' && j + 1 < n && ClassOf(text[j + 1]) != CharClass::kSpace) ++j;
    const CharClass cls = ClassOf(text[j]);
    size_t end = j + 1;
    while (end < n && ClassOf(text[end]) == cls) ++end;
    // A run of whitespace before a word leaves its last space to the word.
    if (cls == CharClass::kSpace && end < n && end - i > 1) --end;
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

}  // namespace

std::vector<char32_t> ByteLevelAlphabet() {
  std::vector<char32_t> alphabet(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    alphabet[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return alphabet;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(Json j, ParseJson(json));
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", why));
  };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object() ||
      !j["model"].contains("vocab") || !j["model"]["vocab"].is_object()) {
    return bad("no model.vocab object (a byte-level BPE tokenizer's, as GPT-2's)");
  }
  BpeTokenizer t;
  const std::vector<char32_t> alphabet = ByteLevelAlphabet();
  std::map<char32_t, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) {
    byte_of[alphabet[b]] = static_cast<unsigned char>(b);
    std::string symbol;
    AppendUtf8(alphabet[b], &symbol);
    t.byte_symbol_.push_back(symbol);
  }
  for (const auto& [text, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return bad(absl::StrFormat("model.vocab[\"%s\"] is not a token id", text));
    }
    std::vector<char32_t> points;
    std::string bytes;
    if (!CodePoints(text, &points)) return bad(absl::StrFormat("\"%s\" is not UTF-8", text));
    for (char32_t c : points) {
      auto it = byte_of.find(c);
      if (it == byte_of.end()) {
        return bad(absl::StrFormat(
            "model.vocab[\"%s\"] has U+%04X, outside the byte-level alphabet (is this a "
            "byte-level BPE tokenizer?)",
            text, static_cast<uint32_t>(c)));
      }
      bytes.push_back(static_cast<char>(it->second));
    }
    const int32_t i = id.get<int32_t>();
    t.ids_[text] = i;
    t.bytes_[i] = bytes;
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const Json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return bad("an added_tokens entry without an integer id and a content string");
      }
      t.bytes_[a["id"].get<int32_t>()] = a["content"].get<std::string>();
    }
  }
  const Json merges = j["model"].contains("merges") ? j["model"]["merges"] : Json::array();
  int rank = 0;
  for (const Json& m : merges) {
    // "left right" (older files) or ["left", "right"].
    if (m.is_string()) {
      t.merge_rank_.emplace(m.get<std::string>(), rank++);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      t.merge_rank_.emplace(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()),
                            rank++);
    } else {
      return bad(absl::StrFormat("model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", rank));
    }
  }
  if (t.bytes_.empty()) return bad("model.vocab is empty");
  t.size_ = t.bytes_.rbegin()->first + 1;
  return t;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  absl::StatusOr<BpeTokenizer> t = FromJson(text);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    auto it = bytes_.find(id);
    if (it == bytes_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token %d has no string in the tokenizer's vocabulary", id));
    }
    out += it->second;
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  for (absl::string_view piece : PreTokenize(text)) {
    std::vector<std::string> symbols;
    for (unsigned char b : piece) symbols.push_back(byte_symbol_[b]);
    // bpe(): merge the adjacent pair of lowest rank, everywhere it occurs, until none is left.
    while (symbols.size() > 1) {
      int best = std::numeric_limits<int>::max();
      std::string best_pair;
      for (size_t k = 0; k + 1 < symbols.size(); ++k) {
        const std::string pair = absl::StrCat(symbols[k], " ", symbols[k + 1]);
        auto it = merge_rank_.find(pair);
        if (it != merge_rank_.end() && it->second < best) {
          best = it->second;
          best_pair = pair;
        }
      }
      if (best_pair.empty()) break;
      std::vector<std::string> merged;
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && absl::StrCat(symbols[k], " ", symbols[k + 1]) == best_pair) {
          merged.push_back(symbols[k] + symbols[k + 1]);
          ++k;
        } else {
          merged.push_back(symbols[k]);
        }
      }
      symbols = std::move(merged);
    }
    for (const std::string& s : symbols) {
      auto it = ids_.find(s);
      if (it == ids_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the tokenizer's vocabulary has no token for \"%s\" (of \"%s\")", s, piece));
      }
      ids.push_back(it->second);
    }
  }
  return ids;
}

}  // namespace tandem
