// Enum values of the API by their short names: the value's name without its enum's prefix, in lower case
// ("cosine" for LR_SCHEDULE_COSINE; the prefix is that of the enum's 0 value, LR_SCHEDULE_UNSPECIFIED). Job
// files are written with them; errors list them.
#pragma once

#include <google/protobuf/descriptor.h>

#include <string>
#include <string_view>

namespace slide::v1 {

// The value called `short_name`, or nullptr when the enum has none (the 0 value, UNSPECIFIED, has no short name).
const google::protobuf::EnumValueDescriptor* FindEnumValueByShortName(const google::protobuf::EnumDescriptor* e,
                                                                      std::string_view short_name);

std::string EnumShortName(const google::protobuf::EnumValueDescriptor* value);

// "auto, cpu or cuda": the short names of every value but UNSPECIFIED, for error messages.
std::string EnumShortNameList(const google::protobuf::EnumDescriptor* e);

}  // namespace slide::v1
