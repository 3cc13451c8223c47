// `slidectl render JOB.yaml`: how a job's first dataset lines become training samples, read locally with the
// engine's own dataset code (the model directory's tokenizer, special tokens and chat template): each line's
// rendered tokens with the trained ones marked, so a user can check a template and its masks before a long run.
#pragma once

#include <cstdint>
#include <string>

#include "slide/v1/slide.pb.h"

namespace slidectl {

struct RenderOptions {
  int64_t first_line = 1;  // the dataset's line number (1-based) to start at
  int64_t lines = 3;       // how many non-empty lines to show
  bool color = false;      // trained text in green (a terminal); else between ⟦ and ⟧
};

// Prints to stdout; returns "" or one line saying why nothing could be rendered. A line that fails is printed with
// its error (as the job would report it) and the next one is shown.
std::string RenderJobLines(const slide::v1::JobSpec& spec, const RenderOptions& options);

}  // namespace slidectl
