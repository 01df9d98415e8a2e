// One name table per enum of the ops layer: the op names, the method names, the layouts. A
// table is the single place that spells an enum's values; to_string and parse come from it,
// so adding a method is one row, and an unknown name is refused with every accepted one
// listed.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "weft/core/error.hpp"

namespace weft::ops {

template <class E>
struct Named {
  E value;
  const char* name;
};

// The name of `v` in `table` ("?" if it has none: a table missing a row).
template <class E, size_t N>
constexpr const char* name_in(const Named<E> (&table)[N], E v) {
  for (const auto& row : table)
    if (row.value == v) return row.name;
  return "?";
}

// "a, b or c": every name of the table, for messages.
template <class E, size_t N>
std::string names_of(const Named<E> (&table)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    if (i) s += i + 1 == N ? " or " : ", ";
    s += table[i].name;
  }
  return s;
}

// The value named `s`; InvalidArgument "unknown <what> 's': expected a, b or c" otherwise.
template <class E, size_t N>
E parse_in(const Named<E> (&table)[N], std::string_view s, const char* what) {
  for (const auto& row : table)
    if (s == row.name) return row.value;
  throw_invalid(__FILE__, __LINE__,
                std::string("unknown ") + what + " '" + std::string(s) + "': expected " + names_of(table));
}

}  // namespace weft::ops
