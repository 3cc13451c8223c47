// A model directory's small JSON files (tokenizer_config.json, special_tokens_map.json, generation_config.json):
// read whole, parsed, refused unless an object, errors naming the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/common/status.h"

namespace slide {

// The object in `path`, or null JSON when the file does not exist.
StatusOr<nlohmann::json> ReadOptionalJsonObject(const std::string& path);

}  // namespace slide
