// What a parsed chat template asks of the Jinja engine, checked before any line is rendered. llama.cpp's engine
// resolves filters, tests, methods and functions by name only when an expression runs, so a template that uses one
// the engine lacks would compile, render every line that does not reach it, and fail (or, for a call that the
// engine resolves to something else, render differently) only on the line that does. Checking the names on the
// syntax tree at submission turns that into an error naming the template's line and the construct.
#pragma once

#include <string>

namespace jinja {
struct program;
}

namespace slide {

// "line L, column C" of byte `pos` in `source` (both 1-based), as template errors name a place.
std::string TemplateLineAndColumn(const std::string& source, size_t pos);

// Empty when every filter, test, method and function `program` names is one the engine has; otherwise the first
// that is not, as "line L, column C: filter 'name' ..." (`source` is the template the program was parsed from).
std::string FirstUnsupportedConstruct(const jinja::program& program, const std::string& source);

}  // namespace slide
