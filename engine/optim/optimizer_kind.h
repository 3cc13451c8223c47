// Which optimizer a job trains with (no LibTorch: the job spec and the daemon name it).
#pragma once

namespace slide {

// adamw: fp32 moments. adamw_8bit: the moments blockwise 8-bit (adamw_8bit.h, laid out by moment_layout.h).
enum class OptimizerKind { kAdamW, kAdamW8bit };

// "adamw", "adamw_8bit": the job field's values.
inline const char* OptimizerName(OptimizerKind kind) { return kind == OptimizerKind::kAdamW ? "adamw" : "adamw_8bit"; }

}  // namespace slide
