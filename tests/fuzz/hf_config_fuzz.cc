// config.json parsing: accepted configs have the invariants the planner and the model rely on.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto cfg = slide::ParseHfConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  if (!cfg.ok()) return 0;
  if (cfg->hidden_size <= 0 || cfg->num_layers <= 0 || cfg->num_heads <= 0 || cfg->num_kv_heads <= 0 ||
      cfg->vocab_size <= 0 || cfg->num_heads % cfg->num_kv_heads != 0)
    std::abort();
  (void)cfg->TotalParamCount();
  return 0;
}
