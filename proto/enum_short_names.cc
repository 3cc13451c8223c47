#include "proto/enum_short_names.h"

#include <cctype>

namespace slide::v1 {
namespace {

// "LR_SCHEDULE_" for LrSchedule: the 0 value's name up to its last '_'.
std::string_view Prefix(const google::protobuf::EnumDescriptor* e) {
  const std::string& zero = e->value(0)->name();
  const size_t cut = zero.rfind('_');
  return cut == std::string::npos ? std::string_view() : std::string_view(zero).substr(0, cut + 1);
}

}  // namespace

std::string EnumShortName(const google::protobuf::EnumValueDescriptor* value) {
  std::string_view name = value->name();
  const std::string_view prefix = Prefix(value->type());
  if (name.substr(0, prefix.size()) == prefix) name.remove_prefix(prefix.size());
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const google::protobuf::EnumValueDescriptor* FindEnumValueByShortName(const google::protobuf::EnumDescriptor* e,
                                                                      std::string_view short_name) {
  for (int i = 1; i < e->value_count(); ++i)
    if (EnumShortName(e->value(i)) == short_name) return e->value(i);
  return nullptr;
}

std::string EnumShortNameList(const google::protobuf::EnumDescriptor* e) {
  std::string out;
  for (int i = 1; i < e->value_count(); ++i) {
    if (i > 1) out += i + 1 == e->value_count() ? " or " : ", ";
    out += EnumShortName(e->value(i));
  }
  return out;
}

}  // namespace slide::v1
