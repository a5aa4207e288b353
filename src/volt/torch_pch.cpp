// Compiled only to produce the precompiled torch header shared by all torch targets.
#include <torch/torch.h>
