#include "server/path_policy.h"

#include <climits>
#include <cstdlib>

namespace slide {
namespace {

// realpath of the deepest existing ancestor + the rest (which may not contain "..").
StatusOr<std::string> Resolve(const std::string& field, const std::string& path) {
  std::string existing = path, rest;
  while (true) {
    char buf[PATH_MAX];
    if (::realpath(existing.c_str(), buf) != nullptr) {
      std::string out = buf;
      if (!rest.empty()) out += (out == "/" ? "" : "/") + rest;
      return out;
    }
    const size_t slash = existing.find_last_of('/');
    if (slash == std::string::npos || existing == "/") break;
    const std::string leaf = existing.substr(slash + 1);
    if (leaf == "..")
      return InvalidArgument("job field '" + field + "': '" + path + "' climbs out of a directory that does not exist");
    if (!leaf.empty() && leaf != ".") rest = rest.empty() ? leaf : leaf + "/" + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  return InvalidArgument("job field '" + field + "': cannot resolve '" + path + "'");
}

}  // namespace

Status CheckJobPath(const std::string& field, const std::string& path, const std::vector<std::string>& roots) {
  if (path.empty() || path[0] != '/')
    return InvalidArgument("job field '" + field + "' must be an absolute path, got '" + path + "'");
  if (roots.empty()) return Status::Ok();
  SLIDE_ASSIGN_OR_RETURN(std::string resolved, Resolve(field, path));
  std::string allowed;
  for (const auto& root : roots) {
    auto r = Resolve("security.allowed_roots", root);
    if (!r.ok()) continue;
    const std::string& base = r.value();
    if (resolved == base || base == "/" || resolved.rfind(base + "/", 0) == 0) return Status::Ok();
    allowed += (allowed.empty() ? "" : ", ") + base;
  }
  return Status(StatusCode::kPermissionDenied, "job field '" + field + "': '" + path + "' (resolved to '" + resolved +
                                                   "') is outside the allowed roots (" + allowed + ")");
}

}  // namespace slide
