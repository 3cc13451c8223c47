#include "engine/runtime/device_queue.h"

#include <c10/util/Exception.h>

namespace slide {

std::unique_ptr<DeviceQueue> MakeDeviceQueue(c10::Device device, int num_slots) {
  if (!device.is_cuda()) return MakeHostDeviceQueue();
#if SLIDE_HAVE_CUDA
  return MakeCudaDeviceQueue(device, num_slots);
#else
  (void)num_slots;
  TORCH_CHECK(false, "this build has no CUDA support");
#endif
}

}  // namespace slide
