// slided's YAML config over the embedded defaults: any text is a config or an error naming FILE:LINE, never a crash.
#include <cstdint>

#include "server/daemon_config.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = slide::LoadDaemonConfig(slide::fuzz::WriteInput(data, size, ".yaml"));
  if (c.ok()) (void)slide::FinalizeDaemonConfig(&*c);
  return 0;
}
