// Where a sliding job keeps each layer's input between the forward and the backward (a job choice, so a light
// header: the daemon's job spec names it without the planner's LibTorch headers).
#pragma once

namespace slide {

enum class CheckpointPlacement { kAuto, kDevice, kHost };  // auto: the planner chooses

}  // namespace slide
