// HostArray: a zero-filled (or copied-into) flat host tensor in its own anonymous mapping. With huge pages on, the
// mapping is advised for transparent huge pages (2 MiB), which the kernel grants where THP is "always" or "madvise"
// (the common default): the fp32 master and AdamW moments that every update streams through then cost a TLB entry per 2
// MiB instead of per 4 KiB, and faulting them in at start-up takes 512 times fewer faults. Where THP is "never" or
// compiled out the array keeps small pages; nothing else changes. Without huge pages the mapping is advised
// MADV_NOHUGEPAGE (small pages even where THP is "always": the comparison). The pages are faulted in on the process's
// thread pool before it returns, so no later step pays for them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace slide {

// `contents` (numel elements of dtype, when given) is copied in instead of zeros. Throws c10::Error when the mapping
// fails (the host is out of memory or address space).
at::Tensor HostArray(int64_t numel, c10::ScalarType dtype, bool huge_pages, const void* contents = nullptr);

// Whether the kernel lets a mapping use transparent huge pages when advised (THP "always" or "madvise").
bool HostHugePagesAvailable();

}  // namespace slide
