// Tests of the JSON numbers, the files' layouts, parsing and the lookups with fallbacks.
#include "runtime/json.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(JsonNumbers, IntegersNullsAndShortestForms) {
  EXPECT_EQ(JsonNumber(6400).dump(), "6400");
  EXPECT_EQ(JsonNumber(-3).dump(), "-3");
  EXPECT_EQ(JsonNumber(0.1).dump(), "0.1");
  EXPECT_EQ(JsonNumber(NAN).dump(), "null");
  EXPECT_EQ(JsonNumber(-INFINITY).dump(), "null");
  EXPECT_EQ(JsonNumber(1e300).dump(), "1e+300");
  EXPECT_EQ(JsonRounded(0.0003914567, 6).dump(), "0.000391");
  EXPECT_EQ(JsonRounded(12.3456, 3).dump(), "12.346");
  EXPECT_EQ(JsonRounded(2.0000001, 6).dump(), "2");
  EXPECT_EQ(JsonFloat(0.0003f).dump(), "0.0003");
  EXPECT_EQ(JsonFloat(5.0f).dump(), "5");
  EXPECT_EQ(JsonFloat(NAN).dump(), "null");
}

TEST(JsonNumbers, EveryFloatReadsBackTheSame) {
  // Floats of every magnitude, and the awkward ones: their text parses back to the same bits.
  const float cases[] = {5.48474979f, 0.1f, 1.0f / 3, 16777217.0f, 3.4028235e38f,
                         1.17549435e-38f, 1.4e-45f, -2.7244f, 123456.789f};
  for (float f : cases) {
    const std::string text = JsonFloat(f).dump();
    EXPECT_EQ(static_cast<float>(std::strtod(text.c_str(), nullptr)), f) << text;
  }
  for (int i = 0; i < 100000; ++i) {
    const float mantissa = static_cast<float>(i * 7919 % 100003) / 100003.0f + 0.5f;
    const float f = std::ldexp(mantissa, i % 80 - 40);
    const std::string text = JsonFloat(f).dump();
    ASSERT_EQ(static_cast<float>(std::strtod(text.c_str(), nullptr)), f) << text;
  }
  // A double too (what run.json reads from the metrics and writes again).
  const double d = 0.1 + 0.2;
  EXPECT_EQ(std::strtod(JsonNumber(d).dump().c_str(), nullptr), d);
}

Json Sample() {
  Json j;
  j["a"] = Json::array({1.5, nullptr, -3, true});
  j["b"] = Json::object();
  j["c"] = "x";
  j["ranks"] = Json::array({Json{{"rank", 0}, {"steps", 2}}, Json{{"rank", 1}}});
  return j;
}

TEST(JsonText, Layouts) {
  EXPECT_EQ(JsonText(Sample(), JsonLayout::kLine),
            "{\"a\": [1.5, null, -3, true], \"b\": {}, \"c\": \"x\", "
            "\"ranks\": [{\"rank\": 0, \"steps\": 2}, {\"rank\": 1}]}");
  // Members in the order they were added; objects inside arrays open too.
  EXPECT_EQ(JsonText(Sample(), JsonLayout::kObjects),
            "{\n"
            "  \"a\": [1.5, null, -3, true],\n"
            "  \"b\": {},\n"
            "  \"c\": \"x\",\n"
            "  \"ranks\": [{\n"
            "      \"rank\": 0,\n"
            "      \"steps\": 2\n"
            "    }, {\n"
            "      \"rank\": 1\n"
            "    }]\n"
            "}");
  EXPECT_EQ(JsonText(Sample(), JsonLayout::kRows),
            "{\n"
            "  \"a\": [\n"
            "    1.5,\n"
            "    null,\n"
            "    -3,\n"
            "    true\n"
            "  ],\n"
            "  \"b\": {},\n"
            "  \"c\": \"x\",\n"
            "  \"ranks\": [\n"
            "    {\"rank\": 0, \"steps\": 2},\n"
            "    {\"rank\": 1}\n"
            "  ]\n"
            "}");
  EXPECT_EQ(JsonText(Json::array(), JsonLayout::kObjects), "[]");
  EXPECT_EQ(JsonText(Json(3), JsonLayout::kRows), "3");
}

TEST(JsonText, EscapesStrings) {
  Json j;
  j["s"] = "a\"b\\c\n\t\x01 h\xc3\xa9";
  EXPECT_EQ(JsonText(j, JsonLayout::kLine), "{\"s\": \"a\\\"b\\\\c\\n\\t\\u0001 h\xc3\xa9\"}");
  j["s"] = "bad \xff byte";  // not UTF-8: replaced, not thrown
  EXPECT_EQ(JsonText(j, JsonLayout::kLine), "{\"s\": \"bad \xef\xbf\xbd byte\"}");
  // What is written reads back.
  j["s"] = "a\"b\\c\n\t\x01";
  absl::StatusOr<Json> back = ParseJson(JsonText(j, JsonLayout::kObjects));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(StringOr(*back, "s", ""), "a\"b\\c\n\t\x01");
}

TEST(ParseJson, EveryKindAndTheLookups) {
  absl::StatusOr<Json> v = ParseJson(
      " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\\"y\\\\z\\n\\u00e9\\ud83d\\ude00\","
      " \"o\": {}, \"e\": []} ");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const Json& a = (*v)["a"];
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[1].get<double>(), -2500);
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(StringOr(*v, "s", ""), "x\"y\\z\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(NumberOr(*v, "missing", 7), 7);
  EXPECT_EQ(NumberOr(*v, "s", 7), 7);  // not a number
  EXPECT_EQ(NumberOr(Json{{"t", true}, {"n", nullptr}}, "t", 7), 1);
  EXPECT_EQ(NumberOr(Json{{"t", true}, {"n", nullptr}}, "n", 7), 7);
  EXPECT_EQ(NumberOr(a, "a", 7), 7);  // not an object
  EXPECT_EQ(StringOr(*v, "o", "none"), "none");
}

TEST(ParseJson, RejectsBrokenDocuments) {
  for (const char* bad :
       {"", "{", "[1,]", "{\"a\" 1}", "\"open", "tru", "{} x", "[01x]", "{\"a\": \"\x01\"}"}) {
    absl::StatusOr<Json> v = ParseJson(bad);
    EXPECT_FALSE(v.ok()) << bad;
    if (!v.ok()) {
      EXPECT_EQ(v.status().message().substr(0, 6), "JSON: ") << v.status();
    }
  }
  EXPECT_FALSE(ParseJson(std::string(200, '[')).ok());
  EXPECT_FALSE(ReadJsonFile("/nonexistent/run.json").ok());
}

}  // namespace
}  // namespace tandem
