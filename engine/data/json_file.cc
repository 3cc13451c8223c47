#include "engine/data/json_file.h"

#include "engine/common/files.h"

namespace slide {

StatusOr<nlohmann::json> ReadOptionalJsonObject(const std::string& path) {
  if (!PathExists(path)) return nlohmann::json();
  SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) return InvalidArgument(path + ": expected a JSON object");
  return j;
}

}  // namespace slide
