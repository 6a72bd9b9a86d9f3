// Internal: HTTP-date (RFC 9110 section 5.6.7) in its three forms, parsed without the C library's
// locale-dependent strptime.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "common/text.hpp"

namespace rebound::detail {

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
constexpr long long days_from_civil(long long y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long long era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<long long>(doe) - 719468;
}

/// A cursor over the text of a date, each step false when the text does not match.
class HttpDateReader {
 public:
  explicit HttpDateReader(std::string_view text) : text_(text) {}

  bool done() const { return at_ == text_.size(); }

  bool literal(std::string_view expected) {
    if (text_.substr(at_, expected.size()) != expected) return false;
    at_ += expected.size();
    return true;
  }

  /// Exactly `count` digits.
  bool digits(std::size_t count, unsigned& value) {
    if (text_.size() - at_ < count) return false;
    value = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const char c = text_[at_ + i];
      if (c < '0' || c > '9') return false;
      value = value * 10 + static_cast<unsigned>(c - '0');
    }
    at_ += count;
    return true;
  }

  /// One of `names`, matched without regard to case; `index` is its position.
  template <std::size_t N>
  bool name(const std::array<std::string_view, N>& names, unsigned& index) {
    for (unsigned i = 0; i < N; ++i) {
      const std::string_view candidate = names[i];
      if (starts_with_ignoring_case(text_.substr(at_), candidate)) {
        at_ += candidate.size();
        index = i;
        return true;
      }
    }
    return false;
  }

  /// "HH:MM:SS"
  bool time_of_day(unsigned& h, unsigned& m, unsigned& s) {
    return digits(2, h) && literal(":") && digits(2, m) && literal(":") && digits(2, s);
  }

 private:
  std::string_view text_;
  std::size_t at_ = 0;
};

/// Seconds since the Unix epoch of an HTTP-date, or nullopt when `text` is none of
/// IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), the obsolete RFC 850 form
/// ("Sunday, 06-Nov-94 08:49:37 GMT") or asctime ("Sun Nov  6 08:49:37 1994"). Names are
/// matched in any case; the weekday is not checked against the date. A two-digit year is the
/// most recent year with those digits not more than 50 years after `current_year`.
inline std::optional<long long> parse_http_date(std::string_view text, long long current_year) {
  static constexpr std::array<std::string_view, 12> months = {
      "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  // Long names first: "Sunday" must not stop at "Sun".
  static constexpr std::array<std::string_view, 7> long_days = {
      "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
  static constexpr std::array<std::string_view, 7> short_days = {"Mon", "Tue", "Wed", "Thu",
                                                                 "Fri", "Sat", "Sun"};
  unsigned ignored = 0, day = 0, month = 0, year = 0, h = 0, m = 0, s = 0;
  long long full_year = 0;
  auto parse = [&](auto&& form) {
    HttpDateReader r(text);
    return form(r) && r.done();
  };
  const bool imf = parse([&](HttpDateReader& r) {
    return r.name(short_days, ignored) && r.literal(", ") && r.digits(2, day) && r.literal(" ") &&
           r.name(months, month) && r.literal(" ") && r.digits(4, year) && r.literal(" ") &&
           r.time_of_day(h, m, s) && r.literal(" GMT");
  });
  if (imf) {
    full_year = year;
  } else if (parse([&](HttpDateReader& r) {
               return r.name(long_days, ignored) && r.literal(", ") && r.digits(2, day) &&
                      r.literal("-") && r.name(months, month) && r.literal("-") &&
                      r.digits(2, year) && r.literal(" ") && r.time_of_day(h, m, s) &&
                      r.literal(" GMT");
             })) {
    full_year = current_year - current_year % 100 + year;
    if (full_year > current_year + 50) full_year -= 100;
  } else if (parse([&](HttpDateReader& r) {
               const bool head = r.name(short_days, ignored) && r.literal(" ") &&
                                 r.name(months, month) && r.literal(" ");
               if (!head) return false;
               // The day of month is two characters: a space and a digit, or two digits.
               const bool day_ok = r.literal(" ") ? r.digits(1, day) : r.digits(2, day);
               return day_ok && r.literal(" ") && r.time_of_day(h, m, s) && r.literal(" ") &&
                      r.digits(4, year);
             })) {
    full_year = year;
  } else {
    return std::nullopt;
  }
  static constexpr std::array<unsigned, 12> month_days = {31, 29, 31, 30, 31, 30,
                                                          31, 31, 30, 31, 30, 31};
  const bool leap = (full_year % 4 == 0 && full_year % 100 != 0) || full_year % 400 == 0;
  if (day < 1 || day > month_days[month] || (month == 1 && day == 29 && !leap)) return std::nullopt;
  if (h > 23 || m > 59 || s > 60) return std::nullopt;
  return days_from_civil(full_year, month + 1, day) * 86400 + h * 3600 + m * 60 + s;
}

}  // namespace rebound::detail
