// ExpectContains: an error message holds the expected part (and the failure shows both).
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace slide::testing {

inline void ExpectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

}  // namespace slide::testing
