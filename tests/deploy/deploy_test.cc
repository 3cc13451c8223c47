// The deployment files: the compose file parses and names only files that exist, the Dockerfile copies and
// runs only what the repository has, and the daemon configurations shipped for the container and the systemd
// unit pass the real slided's --check-config. (promtool checks the Prometheus config, the alert rules and
// their unit tests: tests/CMakeLists.txt.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = SLIDE_SOURCE_DIR;
const fs::path kDeploy = kRoot / "deploy";

// `${VAR:-default}` as compose reads it when VAR is unset; any other text as it is.
std::string WithDefaults(const std::string& s) {
  static const std::regex var(R"(\$\{\w+:-([^}]*)\})");
  return std::regex_replace(s, var, "$1");
}

// A path the compose file names, relative to deploy/: there, or a template (NAME.example) docs/operating.md says to
// copy.
void ExpectExists(const std::string& what, const std::string& path) {
  const fs::path p = kDeploy / WithDefaults(path);
  EXPECT_TRUE(fs::exists(p) || fs::exists(p.string() + ".example")) << what << " names " << p << ", which is missing";
}

TEST(Deploy, ComposeNamesOnlyFilesThatExist) {
  const YAML::Node compose = YAML::LoadFile((kDeploy / "docker-compose.yml").string());
  ASSERT_TRUE(compose["services"].IsMap());
  std::set<std::string> declared_volumes;
  for (const auto& v : compose["volumes"]) declared_volumes.insert(v.first.as<std::string>());
  int bind_mounts = 0;
  for (const auto& service : compose["services"]) {
    const std::string name = service.first.as<std::string>();
    const YAML::Node& s = service.second;
    EXPECT_TRUE(s["image"].IsDefined()) << name;
    if (s["build"]) {
      const fs::path context = kDeploy / s["build"]["context"].as<std::string>();
      EXPECT_TRUE(fs::is_directory(context)) << name;
      EXPECT_TRUE(fs::exists(context / s["build"]["dockerfile"].as<std::string>())) << name;
    }
    for (const auto& f : s["env_file"]) ExpectExists(name + " env_file", f.as<std::string>());
    for (const auto& opt : s["security_opt"]) {
      const std::string o = opt.as<std::string>();
      if (o.rfind("seccomp=", 0) == 0) ExpectExists(name + " seccomp", o.substr(8));
    }
    for (const auto& v : s["volumes"]) {
      const std::string spec = v.as<std::string>();
      const std::string source = spec.substr(0, spec.find(':'));
      if (source.find("${") != std::string::npos) continue;  // a user's folder, with a default under deploy/data
      if (source.rfind("./", 0) == 0 || source.rfind("../", 0) == 0) {
        ExpectExists(name + " volume", source);
        ++bind_mounts;
      } else {
        EXPECT_TRUE(declared_volumes.count(source)) << name << " uses undeclared volume " << source;
      }
    }
  }
  EXPECT_EQ(bind_mounts, 4);  // prometheus config + rules, grafana provisioning + dashboard
}

// deploy/.env's COMPOSE_FILE (what `docker compose up` in deploy/ reads) and the CI override name files that exist,
// and the overrides touch only services the main file has.
TEST(Deploy, ComposeOverridesNameOnlyWhatExists) {
  std::ifstream env(kDeploy / ".env");
  ASSERT_TRUE(env) << "deploy/.env";
  std::string files;
  for (std::string line; std::getline(env, line);)
    if (line.rfind("COMPOSE_FILE=", 0) == 0) files = line.substr(13);
  ASSERT_FALSE(files.empty()) << "deploy/.env sets no COMPOSE_FILE";
  std::vector<std::string> names;
  for (size_t at = 0; at <= files.size();) {
    const size_t end = std::min(files.find(':', at), files.size());
    names.push_back(files.substr(at, end - at));
    at = end + 1;
  }
  EXPECT_EQ(names.front(), "docker-compose.yml");
  names.push_back("docker-compose.ci.yml");
  const YAML::Node main = YAML::LoadFile((kDeploy / "docker-compose.yml").string());
  for (const std::string& name : names) {
    ASSERT_TRUE(fs::exists(kDeploy / name)) << name;
    const YAML::Node f = YAML::LoadFile((kDeploy / name).string());
    for (const auto& service : f["services"])
      EXPECT_TRUE(main["services"][service.first.as<std::string>()]) << name << ": " << service.first;
  }
}

TEST(Deploy, DockerfileCopiesAndRunsOnlyWhatTheRepositoryHas) {
  std::ifstream in(kRoot / "docker" / "Dockerfile");
  ASSERT_TRUE(in) << "docker/Dockerfile";
  const std::regex copy(R"(^COPY\s+(?!--from)(\S+)\s+\S+)"), script(R"(bash\s+((scripts|docker)/[\w.-]+\.sh))");
  int scripts = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, copy) && m[1] != ".") EXPECT_TRUE(fs::exists(kRoot / m[1].str())) << line;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), script); it != std::sregex_iterator(); ++it) {
      EXPECT_TRUE(fs::exists(kRoot / (*it)[1].str())) << line;
      ++scripts;
    }
  }
  EXPECT_GE(scripts, 3);  // install-deps, build, collect-runtime-libs: the project's own scripts
}

int RunSlided(const std::string& args, std::string* out) {
  const std::string cmd = "SLIDE_TOKEN=deploy-test-token " + std::string(SLIDED_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Deploy, ShippedDaemonConfigsPassCheckConfig) {
  for (const fs::path config : {kRoot / "docker" / "slided.yaml", kDeploy / "systemd" / "slided.yaml"}) {
    std::string out;
    EXPECT_EQ(RunSlided("--config " + config.string() + " --check-config", &out), 0) << out;
    EXPECT_NE(out.find("configuration OK"), std::string::npos) << out;
  }
  // The check is real: a bad port fails it.
  std::string out;
  EXPECT_EQ(RunSlided("--listen 127.0.0.1:99999 --check-config", &out), 2) << out;
}

// slided's flags: a misspelt flag, a stray word or a flag without its value stops the start with a line naming it;
// --flag=value works as --flag value does.
TEST(Deploy, SlidedRefusesUnknownFlagsAndMissingValues) {
  std::string out;
  EXPECT_EQ(RunSlided("--chek-config", &out), 2) << out;
  EXPECT_NE(out.find("ERROR The following argument was not expected: --chek-config (see --help)"), std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(RunSlided("serve --check-config", &out), 2) << out;
  EXPECT_NE(out.find("not expected: serve"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunSlided("--check-config --config", &out), 2) << out;
  EXPECT_NE(out.find("--config: 1 required TEXT missing"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunSlided("--check-config --listen=127.0.0.1:0 --metrics-listen off", &out), 0) << out;
  EXPECT_NE(out.find("configuration OK (listen 127.0.0.1:0"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunSlided("--help", &out), 0) << out;
  EXPECT_NE(out.find("--metrics-listen"), std::string::npos) << out;
}

}  // namespace
