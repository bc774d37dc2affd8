// Tests for common/json_util.h: a JSON number becomes an integer only when it is a JSON
// integer inside the target's range; floats (integral-looking or not), strings, booleans,
// null, negatives for unsigned targets and values past the range are refused, naming where.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/json_util.h"

namespace l2l {
namespace {

using json = nlohmann::json;

bool Has(const Status& s, const std::string& part) { return s.message().find(part) != std::string::npos; }

template <typename T>
void ExpectRefused(const char* text, const char* why) {
  const json v = json::parse(text);
  const Result<T> r = JsonInt<T>(v, "f.json: key 'k'");
  INFO(text << " -> " << (r.ok() ? std::string("accepted") : r.status().ToString()));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(Has(r.status(), "f.json: key 'k' = "));
  CHECK(Has(r.status(), why));
}

TEST_CASE("JsonInt accepts JSON integers inside the target type's range", "[common][json]") {
  CHECK(*JsonInt<int64_t>(json::parse("0"), "k") == 0);
  CHECK(*JsonInt<int64_t>(json::parse("-9223372036854775808"), "k") == INT64_MIN);
  CHECK(*JsonInt<int64_t>(json::parse("9223372036854775807"), "k") == INT64_MAX);
  CHECK(*JsonInt<uint64_t>(json::parse("18446744073709551615"), "k") == UINT64_MAX);
  CHECK(*JsonInt<int32_t>(json::parse("2147483647"), "k") == INT32_MAX);
  CHECK(*JsonInt<int32_t>(json::parse("-2147483648"), "k") == INT32_MIN);
  CHECK(*JsonInt<uint32_t>(json::parse("4294967295"), "k") == UINT32_MAX);
  CHECK(*JsonToInt(json::parse("7"), 0, 7, "k") == 7);
  CHECK(*JsonToUint(json::parse("7"), 7, "k") == 7);
}

TEST_CASE("JsonInt refuses floats, strings, booleans, null and out-of-range values, naming the entry",
          "[common][json]") {
  // Floats, even integral ones: nlohmann's get<int64_t>() would cast 5.5e108 (undefined).
  for (const char* f : {"5.5", "2.0", "1e3", "5.5e108", "-1e300"}) ExpectRefused<int64_t>(f, "is not an integer");
  for (const char* f : {"\"5\"", "true", "null", "[1]", "{\"a\": 1}"}) ExpectRefused<int64_t>(f, "is not an integer");
  // Past int64 (an unsigned JSON integer above INT64_MAX used to wrap to a negative).
  ExpectRefused<int64_t>("9223372036854775808", "out of range");
  ExpectRefused<int64_t>("18446744073709551615", "out of range");
  // Past int32 for int targets (get<int32_t>() truncated).
  ExpectRefused<int32_t>("2147483648", "out of range [-2147483648, 2147483647]");
  ExpectRefused<int32_t>("-2147483649", "out of range");
  ExpectRefused<int>("4294967296", "out of range");
  // Negatives for unsigned targets.
  ExpectRefused<uint64_t>("-1", "out of range [0, 18446744073709551615]");
  ExpectRefused<uint32_t>("-1", "out of range");
  ExpectRefused<uint32_t>("4294967296", "out of range");
  ExpectRefused<uint8_t>("256", "out of range [0, 255]");
  // Explicit bounds.
  const Result<int64_t> r = JsonToInt(json::parse("36"), 0, 35, "tokenizer.json: model.vocab[\"a\"]");
  REQUIRE_FALSE(r.ok());
  CHECK(Has(r.status(), "tokenizer.json: model.vocab[\"a\"] = 36 is out of range [0, 35]"));
  CHECK_FALSE(JsonToInt(json::parse("-1"), 0, 35, "k").ok());
  CHECK_FALSE(JsonToUint(json::parse("8"), 7, "k").ok());
}

TEST_CASE("JsonSnippet shortens a long value for error messages", "[common][json]") {
  const json v = std::string(10000, 'x');
  const Result<int64_t> r = JsonInt<int64_t>(v, "k");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().size() < 200);
  CHECK(Has(r.status(), "..."));
}

}  // namespace
}  // namespace l2l
