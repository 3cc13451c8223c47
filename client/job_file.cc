#include "client/job_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <functional>
#include <set>

#include "client/local_file.h"
#include "proto/enum_short_names.h"

namespace slidectl {
namespace {

namespace fs = std::filesystem;
using slide::v1::JobSpec;

std::string Where(const std::string& path, const YAML::Node& n) {
  return path + ":" + std::to_string(n.Mark().line + 1);
}

// One scalar into the field of that name, by the field's type in the schema (slide.proto): the job file knows no
// field by name. Path fields (the `path` option) are resolved against the file's directory.
void SetField(JobSpec* spec, const google::protobuf::FieldDescriptor* f, const YAML::Node& n,
              const std::function<std::string(const std::string&)>& abs_path) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = JobSpec::GetReflection();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_STRING: {
      const std::string v = n.as<std::string>();
      r->SetString(spec, f, f->options().GetExtension(slide::v1::path) ? abs_path(v) : v);
      return;
    }
    case FD::CPPTYPE_INT64:
      return r->SetInt64(spec, f, n.as<int64_t>());
    case FD::CPPTYPE_UINT64:
      return r->SetUInt64(spec, f, n.as<uint64_t>());
    case FD::CPPTYPE_INT32:
      return r->SetInt32(spec, f, n.as<int32_t>());
    case FD::CPPTYPE_DOUBLE:
      return r->SetDouble(spec, f, n.as<double>());
    case FD::CPPTYPE_BOOL:
      return r->SetBool(spec, f, n.as<bool>());
    case FD::CPPTYPE_ENUM:  // by short name (the caller checked that it names a value)
      return r->SetEnum(spec, f, slide::v1::FindEnumValueByShortName(f->enum_type(), n.Scalar()));
    default:  // the schema grew a type job files do not speak yet: refuse rather than guess
      throw YAML::BadConversion(n.Mark());
  }
}

// yaml-cpp 0.7 reads a quote that is never closed as a value running to the end of the file, without an error.
// A quoted scalar (tag "!") must find its closing quote in the text after its opening one.
bool QuoteClosed(const std::string& text, const YAML::Node& n) {
  if (n.Tag() != "!") return true;  // plain scalars
  size_t i = static_cast<size_t>(n.Mark().pos);
  while (i < text.size() && text[i] != '"' && text[i] != '\'' && text[i] != '\n') ++i;
  if (i >= text.size() || text[i] == '\n') return true;  // not a quote we can see: the parser's business
  const char quote = text[i];
  for (++i; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;  // an escaped character
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;  // '' is a quote inside single quotes
      } else {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

std::string LoadJobFile(const std::string& path, JobSpec* spec) {
  std::string error;
  const std::string text = ReadLocalFile(path, "job file", kMaxJobFileBytes, &error);
  if (!error.empty()) return error;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML (" + e.msg + ")";
  }
  if (!root.IsMap()) return path + ": a job file is a mapping of JobSpec fields";
  const fs::path base = fs::absolute(path).parent_path();
  auto abs_path = [&](const std::string& p) {
    return p.empty() || fs::path(p).is_absolute() ? p : (base / p).string();
  };

  std::set<std::string> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar()) return Where(path, it->first) + ": a field name must be text";
    const std::string key = it->first.Scalar();
    if (!seen.insert(key).second) return Where(path, it->first) + ": field '" + key + "' is given twice";
    const google::protobuf::FieldDescriptor* f = JobSpec::descriptor()->FindFieldByName(key);
    if (f == nullptr) return Where(path, it->first) + ": unknown field '" + key + "'";
    if (!it->second.IsScalar()) return Where(path, it->second) + ": field '" + key + "' must be a single value";
    if (!QuoteClosed(text, it->second))
      return Where(path, it->second) + ": field '" + key +
             "': a quoted value is never closed (its quote runs to the "
             "end of the file)";
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_ENUM &&
        slide::v1::FindEnumValueByShortName(f->enum_type(), it->second.Scalar()) == nullptr)
      return Where(path, it->second) + ": field '" + key + "' must be " + slide::v1::EnumShortNameList(f->enum_type()) +
             ", got '" + it->second.Scalar() + "'";
    try {
      SetField(spec, f, it->second, abs_path);
    } catch (const YAML::BadConversion&) {
      return Where(path, it->second) + ": field '" + key + "' has the wrong type ('" + it->second.Scalar() + "')";
    }
  }
  return "";
}

}  // namespace slidectl
