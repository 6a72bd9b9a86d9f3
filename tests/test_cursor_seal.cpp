// The listing's sealed cursors (src/http/cursor_seal.hpp) and their text (list_cursor.hpp):
// what a client can and cannot do with one.
#include <doctest/doctest.h>

#include <string>

#include "http/cursor_seal.hpp"
#include "http/list_cursor.hpp"

using rebound::detail::CursorSeal;

TEST_CASE("cursor seal: opens what it sealed - for the same context and key only") {
  const CursorSeal seal("whsec_shared\n", 64), same("whsec_shared\n", 64),
      other("whsec_other\n", 64);
  const std::string sealed = seal.seal("1700000000000_6162", "failed-callbacks\nacme");
  REQUIRE_FALSE(sealed.empty());
  CHECK(seal.open(sealed, "failed-callbacks\nacme") == std::string("1700000000000_6162"));
  CHECK(same.open(sealed, "failed-callbacks\nacme") == std::string("1700000000000_6162"));
  CHECK_FALSE(other.open(sealed, "failed-callbacks\nacme"));   // another fleet's key
  CHECK_FALSE(seal.open(sealed, "failed-callbacks\nglobex"));  // another tenant
  CHECK_FALSE(seal.open(sealed, "jobs\nacme"));                // another listing
  // Each character changed, or one dropped or added, is refused.
  for (std::size_t i = 0; i < sealed.size(); ++i) {
    std::string altered = sealed;
    altered[i] = altered[i] == 'A' ? 'B' : 'A';
    CAPTURE(i);
    CHECK_FALSE(seal.open(altered, "failed-callbacks\nacme"));
  }
  CHECK_FALSE(seal.open(sealed.substr(1), "failed-callbacks\nacme"));
  CHECK_FALSE(seal.open(sealed + "A", "failed-callbacks\nacme"));
  for (const char* junk : {"", "A", "AAAA", "====", "a b", "%00", "x/y+z"})
    CHECK_FALSE(seal.open(junk, "failed-callbacks\nacme"));
  CHECK_FALSE(seal.open(std::string(100000, 'A'), "failed-callbacks\nacme"));
  // Two seals of one text differ (a fresh nonce each), and both open.
  const std::string again = seal.seal("1700000000000_6162", "failed-callbacks\nacme");
  CHECK(again != sealed);
  CHECK(seal.open(again, "failed-callbacks\nacme") == std::string("1700000000000_6162"));
}

TEST_CASE("cursor seal: every cursor has one length - its text's is not shown") {
  const CursorSeal seal("whsec_shared\n", 400);
  const std::string short_one = seal.seal("1_61", "c"),
                    long_one = seal.seal(std::string(300, '7'), "c");
  CHECK(short_one.size() == long_one.size());
  CHECK(seal.open(short_one, "c") == std::string("1_61"));
  CHECK(seal.open(long_one, "c") == std::string(300, '7'));
}

TEST_CASE("cursor seal: without a shared secret each seal has its own key") {
  const CursorSeal one("", 64), two("", 64);
  const std::string sealed = one.seal("1_61", "c");
  CHECK(one.open(sealed, "c") == std::string("1_61"));
  CHECK_FALSE(two.open(sealed, "c"));
}

TEST_CASE("listing cursor text: milliseconds within what the clock holds - the id in hex") {
  using rebound::detail::parse_list_cursor_text;
  const auto fine = parse_list_cursor_text("9223372036854_6162");  // the clock's last millisecond
  REQUIRE(fine);
  CHECK(fine->id == "ab");
  CHECK_FALSE(parse_list_cursor_text("9223372036855_6162"));  // one past: would wrap around
  CHECK_FALSE(parse_list_cursor_text("9999999999999_6162"));
  CHECK_FALSE(parse_list_cursor_text("1_616"));  // odd hex
  CHECK_FALSE(parse_list_cursor_text("1_6G"));
}
