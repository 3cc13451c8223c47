// slidectl's YAML job files: any text is a job spec or an error message, never a crash.
#include <cstdint>

#include "client/job_file.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  slide::v1::JobSpec spec;
  (void)slidectl::LoadJobFile(slide::fuzz::WriteInput(data, size, ".yaml"), &spec);
  return 0;
}
