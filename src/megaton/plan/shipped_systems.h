// Systems `megaton plan --system NAME` knows without a file: NVIDIA A100 / H100 / H200 / B200 SXM
// nodes of 8 GPUs, from the published datasheet figures (dense peak FLOP/s, HBM capacity and
// bandwidth, NVLink and the per-GPU InfiniBand NIC). Their efficiency tables are estimates
// (source = "datasheet") until `megaton plan calibrate` is run on the device itself.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "megaton/plan/system.h"

namespace megaton::plan {

std::optional<SystemSpec> shipped_system(const std::string& name);
std::vector<std::string> shipped_system_names();

}  // namespace megaton::plan
