#include "client/job_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <functional>
#include <map>
#include <set>

namespace slidectl {
namespace {

namespace fs = std::filesystem;
using slide::v1::JobSpec;

std::string Where(const std::string& path, const YAML::Node& n) {
  return path + ":" + std::to_string(n.Mark().line + 1);
}

}  // namespace

std::string LoadJobFile(const std::string& path, JobSpec* spec) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return path + ": cannot open job file";
  } catch (const YAML::ParserException& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML (" + e.msg + ")";
  }
  if (!root.IsMap()) return path + ": a job file is a mapping of JobSpec fields";
  const fs::path base = fs::absolute(path).parent_path();
  auto abs_path = [&](const std::string& p) {
    return p.empty() || fs::path(p).is_absolute() ? p : (base / p).string();
  };

  auto str = [](void (JobSpec::*f)(const std::string&)) -> std::function<void(JobSpec*, const YAML::Node&)> {
    return [f](JobSpec* s, const YAML::Node& n) { (s->*f)(n.as<std::string>()); };
  };
  const std::map<std::string, std::function<void(JobSpec*, const YAML::Node&)>> fields = {
      {"name", str(&JobSpec::set_name)},
      {"model_dir", [&](JobSpec* s, const YAML::Node& n) { s->set_model_dir(abs_path(n.as<std::string>())); }},
      {"dataset", [&](JobSpec* s, const YAML::Node& n) { s->set_dataset(abs_path(n.as<std::string>())); }},
      {"output_dir", [&](JobSpec* s, const YAML::Node& n) { s->set_output_dir(abs_path(n.as<std::string>())); }},
      {"steps", [](JobSpec* s, const YAML::Node& n) { s->set_steps(n.as<int64_t>()); }},
      {"epochs", [](JobSpec* s, const YAML::Node& n) { s->set_epochs(n.as<int64_t>()); }},
      {"batch_size", [](JobSpec* s, const YAML::Node& n) { s->set_batch_size(n.as<int64_t>()); }},
      {"micro_batch_size", [](JobSpec* s, const YAML::Node& n) { s->set_micro_batch_size(n.as<int64_t>()); }},
      {"seq_len", [](JobSpec* s, const YAML::Node& n) { s->set_seq_len(n.as<int64_t>()); }},
      {"lr", [](JobSpec* s, const YAML::Node& n) { s->set_lr(n.as<double>()); }},
      {"lr_schedule", str(&JobSpec::set_lr_schedule)},
      {"warmup_steps", [](JobSpec* s, const YAML::Node& n) { s->set_warmup_steps(n.as<int64_t>()); }},
      {"weight_decay", [](JobSpec* s, const YAML::Node& n) { s->set_weight_decay(n.as<double>()); }},
      {"max_grad_norm", [](JobSpec* s, const YAML::Node& n) { s->set_max_grad_norm(n.as<double>()); }},
      {"seed", [](JobSpec* s, const YAML::Node& n) { s->set_seed(n.as<uint64_t>()); }},
      {"adam_beta1", [](JobSpec* s, const YAML::Node& n) { s->set_adam_beta1(n.as<double>()); }},
      {"adam_beta2", [](JobSpec* s, const YAML::Node& n) { s->set_adam_beta2(n.as<double>()); }},
      {"adam_eps", [](JobSpec* s, const YAML::Node& n) { s->set_adam_eps(n.as<double>()); }},
      {"log_every", [](JobSpec* s, const YAML::Node& n) { s->set_log_every(n.as<int64_t>()); }},
      {"dataset_format", str(&JobSpec::set_dataset_format)},
      {"chat_template", str(&JobSpec::set_chat_template)},
      {"sequence_mode", str(&JobSpec::set_sequence_mode)},
      {"bad_lines", str(&JobSpec::set_bad_lines)},
      {"eval_fraction", [](JobSpec* s, const YAML::Node& n) { s->set_eval_fraction(n.as<double>()); }},
      {"device", str(&JobSpec::set_device)},
      {"compute_dtype", str(&JobSpec::set_compute_dtype)},
      {"gpu_budget_bytes", [](JobSpec* s, const YAML::Node& n) { s->set_gpu_budget_bytes(n.as<int64_t>()); }},
      {"window", [](JobSpec* s, const YAML::Node& n) { s->set_window(n.as<int64_t>()); }},
      {"activation_placement", str(&JobSpec::set_activation_placement)},
      {"export_dtype", str(&JobSpec::set_export_dtype)},
      {"nvme_state", str(&JobSpec::set_nvme_state)},
      {"checkpoint_every", [](JobSpec* s, const YAML::Node& n) { s->set_checkpoint_every(n.as<int64_t>()); }},
      {"allow_seq_len_beyond_model",
       [](JobSpec* s, const YAML::Node& n) { s->set_allow_seq_len_beyond_model(n.as<bool>()); }},
  };
  std::set<std::string> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar()) return Where(path, it->first) + ": a field name must be text";
    const std::string key = it->first.Scalar();
    if (!seen.insert(key).second) return Where(path, it->first) + ": field '" + key + "' is given twice";
    auto f = fields.find(key);
    if (f == fields.end()) return Where(path, it->first) + ": unknown field '" + key + "'";
    if (!it->second.IsScalar()) return Where(path, it->second) + ": field '" + key + "' must be a single value";
    try {
      f->second(spec, it->second);
    } catch (const YAML::BadConversion&) {
      return Where(path, it->second) + ": field '" + key + "' has the wrong type ('" + it->second.Scalar() + "')";
    }
  }
  return "";
}

}  // namespace slidectl
