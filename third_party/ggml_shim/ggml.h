// Stands in for ggml.h, which llama.cpp's common/json.cpp includes only for GGML_ASSERT: an invariant check that
// aborts with the failed condition, as ggml's does.
#pragma once
#include <cstdio>
#include <cstdlib>

#define GGML_ASSERT(x)                                                                 \
  do {                                                                                 \
    if (!(x)) {                                                                        \
      std::fprintf(stderr, "%s:%d: GGML_ASSERT(%s) failed\n", __FILE__, __LINE__, #x); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
