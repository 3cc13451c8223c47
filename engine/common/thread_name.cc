#include "engine/common/thread_name.h"

#include <pthread.h>

#include <string>

namespace slide {

void NameThisThread(const char* name) {
  const std::string shortened = std::string(name).substr(0, 15);  // longer names are refused, not cut
  pthread_setname_np(pthread_self(), shortened.c_str());
}

}  // namespace slide
