// Host memory advice for the optimizer's large buffers. The CPU update streams ~28 bytes per parameter through
// memory; on 4 KiB pages the hardware prefetchers stop at every page boundary and the TLB misses every 1024
// floats per stream. Where transparent huge pages are in `madvise` mode (the common default), the buffers ask
// for 2 MiB pages before they are first touched.
#pragma once

#include <cstddef>

namespace slide {

// True when advising helps: THP in `madvise` mode and SLIDE_HUGEPAGES is not 0 (benchmarks compare both).
bool HugePageAdviceWanted();
// MADV_HUGEPAGE over the whole 2 MiB pages inside [p, p + bytes); a no-op when not wanted or nothing fits.
void AdviseHugePages(void* p, size_t bytes);

}  // namespace slide
