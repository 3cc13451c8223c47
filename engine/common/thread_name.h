// NameThisThread: the name ps, top and debuggers show for the calling thread (Linux keeps 15 characters), so a
// stalled or busy thread of the engine can be told apart from the outside (ps -L, /proc/PID/task/*/comm).
#pragma once

namespace slide {

void NameThisThread(const char* name);

}  // namespace slide
